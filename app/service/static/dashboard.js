// The built-in dashboard: polls /v1/requests, draws the latency chart, the request table with a
// stage bar per row, and for the selected request its stage waterfall, class legend and a 3D view
// of its points (three.js). A file dropped on the page is posted to /v1/segment.
import * as THREE from "three";
import { OrbitControls } from "/static/vendor/three/OrbitControls.js";

let STAGES = ["receive", "decode", "queue", "voxelize", "maps", "network", "devoxelize", "encode"];  // the server's list replaces it
const STAGE_COLORS = ["#8e6fd8", "#b0b0b0", "#2f9e8f", "#e0a030", "#3b6fd8", "#d05a8a", "#6a9a3a"];
const POLL_MS = 1000;
const $ = (id) => document.getElementById(id);
const state = { selected: null, classes: [], rows: [], plot: null, shownPoints: null,
  rawLayouts: null };  // a .bin file's layout by its name: the server's rule (/v1/requests)

function setStatus(text) { $("status").textContent = text; }
const fmtMs = (v) => (v == null ? "-" : `${v.toFixed(1)} ms`);

async function getJSON(url) {
  const r = await fetch(url, { cache: "no-store" });
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}

// ---- table and chart ------------------------------------------------------------------------
function stageBar(timing) {
  const total = timing.total || STAGES.reduce((s, k) => s + (timing[k] || 0), 0) || 1;
  const bar = document.createElement("div");
  bar.className = "bar";
  STAGES.forEach((k, i) => {
    if (!timing[k]) return;
    const seg = document.createElement("span");
    seg.style.width = `${(100 * timing[k]) / total}%`;
    seg.style.background = STAGE_COLORS[i % STAGE_COLORS.length];
    seg.title = `${k} ${timing[k].toFixed(2)} ms`;
    bar.appendChild(seg);
  });
  return bar;
}

function renderTable(rows) {
  const body = document.querySelector("#requests tbody");
  body.replaceChildren(...rows.map((r) => {
    const tr = document.createElement("tr");
    tr.dataset.id = r.id;
    if (r.status >= 400) tr.classList.add("error");
    if (r.id === state.selected) tr.classList.add("selected");
    const cells = [new Date(r.time * 1000).toLocaleTimeString(), r.id.slice(0, 12), r.status,
      r.format ?? "-", r.points ?? "-", r.voxels ?? "-", r.batch_size ?? "-",
      (r.timing_ms.total ?? 0).toFixed(1)];
    const names = ["time", "id", "status", "format", "points", "voxels", "batch", "total"];
    cells.forEach((c, i) => {
      const td = document.createElement("td");
      td.textContent = c;
      td.className = names[i];
      tr.appendChild(td);
    });
    const td = document.createElement("td");
    td.appendChild(stageBar(r.timing_ms));
    tr.appendChild(td);
    tr.addEventListener("click", () => select(r.id));
    return tr;
  }));
}

function renderChart(rows) {
  const ok = rows.filter((r) => r.status === 200).slice().reverse();
  const data = [ok.map((r) => r.time), ok.map((r) => r.timing_ms.total),
    ok.map((r) => r.timing_ms.network ?? null)];
  if (!state.plot) {
    const el = $("chart");
    state.plot = new uPlot({
      width: Math.max(el.clientWidth, 400), height: 180, title: "latency per request (ms)",
      series: [{}, { label: "total", stroke: "#3b6fd8", points: { show: true } },
        { label: "network", stroke: "#e0a030" }],
      axes: [{}, { label: "ms" }],
    }, data, el);
  } else {
    state.plot.setData(data);
  }
}

function renderStats(stats) {
  $("p50").textContent = fmtMs(stats.p50);
  $("p95").textContent = fmtMs(stats.p95);
  $("p99").textContent = fmtMs(stats.p99);
  $("rps").textContent = `${stats.throughput_rps.toFixed(2)} /s`;
  $("held").textContent = `${stats.requests} / ${stats.size}`;
}

async function poll() {
  try {
    const data = await getJSON("/v1/requests?limit=200");
    state.classes = data.classes;
    if (data.stages) STAGES = data.stages;
    state.rawLayouts = data.raw_layouts;
    state.rows = data.requests;
    renderStats(data.stats);
    renderTable(data.requests);
    renderChart(data.requests);
    // its own line: a poll must not overwrite what a dropped file's status says
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    $("updated").textContent = `${e.message}`;
  }
}

// ---- the selected request ---------------------------------------------------------------------
function renderWaterfall(timing) {
  const total = timing.total || 1;
  const rows = [];
  let start = 0;
  STAGES.forEach((k, i) => {
    const ms = timing[k] || 0;
    const row = document.createElement("div");
    row.className = "row";
    row.dataset.stage = k;
    row.innerHTML = `<span>${k}</span><div class="track"><div class="seg"></div></div>` +
      `<span class="ms">${ms.toFixed(2)}</span>`;
    const seg = row.querySelector(".seg");
    seg.style.left = `${(100 * start) / total}%`;
    seg.style.width = `${(100 * ms) / total}%`;
    seg.style.background = STAGE_COLORS[i % STAGE_COLORS.length];
    start += ms;
    rows.push(row);
  });
  const sum = document.createElement("div");
  sum.className = "row";
  sum.dataset.stage = "total";
  sum.innerHTML = `<b>total</b><span></span><b class="ms">${(timing.total || 0).toFixed(2)}</b>`;
  rows.push(sum);
  $("waterfall").replaceChildren(...rows);
}

function colorOf(label) {
  const c = state.classes[label];
  return c ? c.color : [128, 128, 128];
}

function renderLegend(counts) {
  const items = Object.entries(counts || {}).sort((a, b) => b[1] - a[1]).map(([name, n]) => {
    const cls = state.classes.find((c) => c.name === name);
    const rgb = cls ? cls.color : [128, 128, 128];
    const li = document.createElement("li");
    li.innerHTML = `<span class="sw" style="background: rgb(${rgb.join(",")})"></span>` +
      `<span>${name}</span><span class="n">${n}</span>`;
    return li;
  });
  $("legend").replaceChildren(...items);
}

async function select(id) {
  state.selected = id;
  document.querySelectorAll("#requests tbody tr").forEach(
    (tr) => tr.classList.toggle("selected", tr.dataset.id === id));
  const detail = await getJSON(`/v1/requests/${encodeURIComponent(id)}`);
  state.classes = detail.classes;
  $("sel-title").textContent = `request ${id}: ${detail.points ?? 0} points, ` +
    `${detail.voxels ?? 0} voxels, HTTP ${detail.status}` +
    (detail.trace_id ? `, trace ${detail.trace_id}` : "");
  renderWaterfall(detail.timing_ms);
  renderLegend(detail.class_counts);
  if (detail.has_points) {
    await showPoints(id);
  } else {
    viewer.clear();
    $("view-note").textContent = "points not kept (memory budget, or keeping points is off)";
  }
}

async function showPoints(id) {
  const r = await fetch(`/v1/requests/${encodeURIComponent(id)}/points`, { cache: "no-store" });
  if (!r.ok) throw new Error(`points: HTTP ${r.status}`);
  const n = Number(r.headers.get("X-Num-Points"));
  const buf = await r.arrayBuffer();
  const xyz = new Float32Array(buf, 0, n * 3);
  const labels = new Uint8Array(buf, n * 12, n);
  viewer.show(xyz, labels);
  $("view-note").textContent = `${n} points`;
  state.shownPoints = n;
}

// ---- 3D view --------------------------------------------------------------------------------
const viewer = (() => {
  const canvas = $("cloud");
  const renderer = new THREE.WebGLRenderer({ canvas, antialias: false, preserveDrawingBuffer: true });
  renderer.setPixelRatio(window.devicePixelRatio);
  const scene = new THREE.Scene();
  scene.background = new THREE.Color(0x10141c);
  const camera = new THREE.PerspectiveCamera(55, 1, 0.1, 2000);
  camera.up.set(0, 0, 1);  // LiDAR frames are z-up
  const controls = new OrbitControls(camera, canvas);
  const material = new THREE.PointsMaterial({ size: 2, vertexColors: true, sizeAttenuation: false });
  let points = null;
  let home = null;
  const render = () => renderer.render(scene, camera);
  function resize() {
    const w = canvas.clientWidth, h = canvas.clientHeight;
    renderer.setSize(w, h, false);
    camera.aspect = w / Math.max(h, 1);
    camera.updateProjectionMatrix();
    render();
  }
  function clear() {
    if (points) { scene.remove(points); points.geometry.dispose(); points = null; }
    render();
  }
  function show(xyz, labels) {
    clear();
    const n = labels.length;
    const pos = new Float32Array(n * 3), col = new Float32Array(n * 3);
    let m = 0;
    for (let i = 0; i < n; i++) {
      const x = xyz[3 * i], y = xyz[3 * i + 1], z = xyz[3 * i + 2];
      if (!Number.isFinite(x) || !Number.isFinite(y) || !Number.isFinite(z)) continue;
      const c = colorOf(labels[i]);
      pos[3 * m] = x; pos[3 * m + 1] = y; pos[3 * m + 2] = z;
      col[3 * m] = c[0] / 255; col[3 * m + 1] = c[1] / 255; col[3 * m + 2] = c[2] / 255;
      m++;
    }
    const geometry = new THREE.BufferGeometry();
    geometry.setAttribute("position", new THREE.BufferAttribute(pos.subarray(0, 3 * m), 3));
    geometry.setAttribute("color", new THREE.BufferAttribute(col.subarray(0, 3 * m), 3));
    geometry.computeBoundingSphere();
    points = new THREE.Points(geometry, material);
    scene.add(points);
    const s = geometry.boundingSphere;
    const r = Math.max(s.radius, 1);
    home = { target: s.center.clone(),
      eye: s.center.clone().add(new THREE.Vector3(-0.6 * r, -0.6 * r, 0.5 * r)) };
    reset();
  }
  function reset() {
    if (!home) return render();
    controls.target.copy(home.target);
    camera.position.copy(home.eye);
    controls.update();
    render();
  }
  controls.addEventListener("change", render);
  window.addEventListener("resize", resize);
  $("psize").addEventListener("input", (e) => { material.size = Number(e.target.value); render(); });
  $("reset").addEventListener("click", reset);
  resize();
  return { show, clear, reset };
})();

// ---- drop a frame ---------------------------------------------------------------------------
// A raw .bin file's layout (sensor) by its name, by the server's rule; any other file's format
// the server reads from its bytes.
function formatOf(name) {
  const n = name.toLowerCase();
  if (!n.endsWith(".bin")) return null;
  const hit = state.rawLayouts.hints.find(([hint]) => n.includes(hint));
  return hit ? hit[1] : state.rawLayouts.default;
}

async function segmentFile(file) {
  setStatus(`segmenting ${file.name} ...`);
  const raw = file.name.toLowerCase().endsWith(".bin");  // only these need the server's table
  if (raw && !state.rawLayouts) await poll();
  if (raw && !state.rawLayouts) {
    setStatus(`${file.name}: the server's list of layouts did not come (${$("updated").textContent})`);
    return;
  }
  const fmt = formatOf(file.name);
  const url = "/v1/segment" + (fmt ? `?format=${fmt}` : "");
  const r = await fetch(url, { method: "POST", body: file, headers: {
    "Content-Type": "application/octet-stream", Accept: "application/octet-stream" } });
  if (!r.ok) {
    const body = await r.json().catch(() => ({}));
    setStatus(`${file.name}: HTTP ${r.status} ${body.error || ""} ${body.detail || ""}`);
    return;
  }
  const id = r.headers.get("X-Request-Id");
  try {
    await poll();
    await select(id);
    setStatus(`${file.name}: ${r.headers.get("X-Num-Points")} points segmented`);
  } catch (e) {
    setStatus(`${file.name}: segmented, but showing it failed: ${e.message}`);
  }
}

const drop = $("drop");
["dragenter", "dragover"].forEach((t) => drop.addEventListener(t, (e) => {
  e.preventDefault();
  drop.classList.add("over");
}));
["dragleave", "drop"].forEach((t) => drop.addEventListener(t, () => drop.classList.remove("over")));
drop.addEventListener("drop", (e) => {
  e.preventDefault();
  if (e.dataTransfer.files.length) segmentFile(e.dataTransfer.files[0]);
});
$("file").addEventListener("change", (e) => { if (e.target.files.length) segmentFile(e.target.files[0]); });

// model name in the header (optional: /v1/model answers 503 while loading)
fetch("/v1/model").then((r) => (r.ok ? r.json() : null)).then((m) => {
  if (m) $("model").textContent = `${m.name} ${m.version} on ${m.device}`;
}).catch(() => {});
window.lidarsegDashboard = { select, poll, state };
poll();
setInterval(poll, POLL_MS);
