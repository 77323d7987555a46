#!/usr/bin/env bash
# Re-vendors the dashboard's and /docs' browser assets from the npm registry (`npm pack`, no
# install scripts run): the files the pages load, each package's licence, and VERSIONS.
# Usage: bash app/service/static/vendor/update.sh   (bump the versions here first)
set -euo pipefail
cd "$(dirname "$0")"
THREE=0.187.0 UPLOT=1.6.32 SWAGGER=5.35.0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "three@$THREE" "uplot@$UPLOT" "swagger-ui-dist@$SWAGGER" >/dev/null)
for pkg in three uplot swagger-ui; do rm -rf "$pkg"; mkdir -p "$pkg"; done
tar xzf "$tmp/three-$THREE.tgz" -C "$tmp" && mv "$tmp/package" "$tmp/three"
cp "$tmp/three/build/three.module.js" "$tmp/three/build/three.core.js" \
   "$tmp/three/examples/jsm/controls/OrbitControls.js" "$tmp/three/LICENSE" three/
tar xzf "$tmp/uplot-$UPLOT.tgz" -C "$tmp" && mv "$tmp/package" "$tmp/uplot"
cp "$tmp/uplot/dist/uPlot.iife.min.js" "$tmp/uplot/dist/uPlot.min.css" "$tmp/uplot/LICENSE" uplot/
tar xzf "$tmp/swagger-ui-dist-$SWAGGER.tgz" -C "$tmp" && mv "$tmp/package" "$tmp/swagger"
cp "$tmp/swagger/swagger-ui-bundle.js" "$tmp/swagger/swagger-ui.css" \
   "$tmp/swagger/favicon-32x32.png" "$tmp/swagger/LICENSE" "$tmp/swagger/NOTICE" \
   "$tmp/swagger/swagger-ui-bundle.js.LICENSE.txt" swagger-ui/
# the bundle points at a source map that is not vendored: drop the comment (no 404 in devtools)
sed -i '/^\/\/# sourceMappingURL=/d' swagger-ui/swagger-ui-bundle.js
sed -i 's|/\*# sourceMappingURL=[^*]*\*/||' swagger-ui/swagger-ui.css
printf 'three %s (MIT)\nuplot %s (MIT)\nswagger-ui-dist %s (Apache-2.0)\n' \
  "$THREE" "$UPLOT" "$SWAGGER" > VERSIONS
