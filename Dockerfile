# syntax=docker/dockerfile:1
# lidarseg service image, x86-64. Targets (README "Deploy"):
#   cpu  (default)  BASE_IMAGE with the CPU torch; kernels for x86-64-v2, -v3 and -v4, the loader
#                   picks the best one the CPU runs (AVX-512 only where the CPU has it)
#   cuda            the same plus a CUDA torch and the CUDA kernels for sm_75 .. sm_90 + PTX
#   docker build -t lidarseg:cpu .
#   docker build --target cuda -t lidarseg:cuda .
# BASE_IMAGE may be python:3.11-slim-bookworm (default) or any Debian bookworm root with python3
# and python3-venv (deploy/image/base.sh builds one where no registry is reachable).
# pip's CA bundle, if the network needs one, is handed in at build time only:
#   --secret id=pipcert,src=/etc/ssl/certs/ca-certificates.crt
ARG BASE_IMAGE=python:3.11-slim-bookworm
# nvcc for the CUDA kernels; Ubuntu 22.04's glibc (2.35) is older than bookworm's, so the library
# it links runs in the bookworm-based runtime image.
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:12.6.3-devel-ubuntu22.04

# ---- Python dependencies and the CPU kernels (compilers stay in these stages) ----
FROM ${BASE_IMAGE} AS deps
# pip's local wheel folder, if any (e.g. with `-v /opt/wheels:/wheels:ro`); empty: the indexes.
# An ARG is seen only by the stage that declares it: each pip stage declares this one.
ARG PIP_FIND_LINKS=""
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY requirements/service.txt requirements/service.txt
RUN --mount=type=secret,id=pipcert \
    if [ -f /run/secrets/pipcert ]; then export PIP_CERT=/run/secrets/pipcert; fi \
 && pip install --no-cache-dir -r requirements/service.txt

FROM deps AS builder
ARG PIP_FIND_LINKS=""
# The CPU torch: TORCH_SPEC (pinned) from TORCH_INDEX_URL (PyTorch's CPU wheels) or
# PIP_FIND_LINKS (then TORCH_INDEX_URL="" leaves PyPI as the index for the rest).
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG CPU_ISAS="x86-64-v2 x86-64-v3 x86-64-v4"
# hadolint ignore=DL3013
RUN --mount=type=secret,id=pipcert \
    if [ -f /run/secrets/pipcert ]; then export PIP_CERT=/run/secrets/pipcert; fi \
 && pip install --no-cache-dir ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH_SPEC"
# the code last: a code change reuses every layer above
COPY kernels/ kernels/
COPY app/ app/
COPY models/ models/
RUN LIDARSEG_BUILD_DIR=/opt/lidarseg/lib python -m kernels.build --isa ${CPU_ISAS} \
 && python -m compileall -q app models kernels

FROM deps AS builder-cuda
ARG PIP_FIND_LINKS=""
# A CUDA torch: PyPI's default x86-64 Linux wheel is a CUDA build; CUDA_TORCH_INDEX_URL picks
# another (e.g. https://download.pytorch.org/whl/cu126). CUDA_TORCH_SPEC="" keeps a torch the
# base image already brings (an NGC PyTorch base), never reinstalling it.
ARG CUDA_TORCH_SPEC="torch==2.13.0"
ARG CUDA_TORCH_INDEX_URL=""
ARG CPU_ISAS="x86-64-v2 x86-64-v3 x86-64-v4"
# hadolint ignore=DL3013
RUN --mount=type=secret,id=pipcert \
    if [ -f /run/secrets/pipcert ]; then export PIP_CERT=/run/secrets/pipcert; fi \
 && if [ -n "$CUDA_TORCH_SPEC" ]; then \
      pip install --no-cache-dir ${CUDA_TORCH_INDEX_URL:+--index-url "$CUDA_TORCH_INDEX_URL"} \
        "$CUDA_TORCH_SPEC"; \
    fi
COPY kernels/ kernels/
COPY app/ app/
COPY models/ models/
RUN LIDARSEG_BUILD_DIR=/opt/lidarseg/lib python -m kernels.build --isa ${CPU_ISAS} \
 && python -m compileall -q app models kernels

FROM ${CUDA_DEVEL_IMAGE} AS cuda-kernels
ARG LIDARSEG_CUDA_ARCHS="75 80 86 87 89 90"
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/*
COPY kernels/ /src/kernels/
# build.py run as a file needs no torch; machine code for every arch, PTX for the highest
RUN LIDARSEG_BUILD_DIR=/opt/lidarseg/lib python3 /src/kernels/build.py --isa none

# ---- Run time: no compilers, non-root, read-only code and kernels ----
FROM ${BASE_IMAGE} AS runtime-base
ARG VERSION=0.0.0-dev
ARG REVISION=unknown
ARG LICENSE=NOASSERTION
LABEL org.opencontainers.image.title="lidarseg" \
      org.opencontainers.image.description="LiDAR semantic segmentation inference service" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="${LICENSE}"
# tini: PID 1 (below); libgomp1: the kernels' OpenMP runtime; libusb-1.0-0, libegl1 and libgl1:
# Open3D (without libEGL.so.1 and libGL.so.1 it does not load, and the service voxelized with
# torch.unique, 75x slower: /v1/model's engine.voxelizer; libgl1 brings Mesa: the image 2.42 ->
# 2.68 GB)
# (99lidarseg-build-host: deploy/image/base.sh's apt setting for its build host's mirror)
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini libgomp1 libusb-1.0-0 libegl1 libgl1 \
 && rm -rf /var/lib/apt/lists/* /etc/apt/apt.conf.d/99lidarseg-build-host \
 && useradd --system --uid 10001 --user-group --home-dir /tmp --no-create-home \
      --shell /usr/sbin/nologin lidarseg
WORKDIR /opt/lidarseg
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LIDARSEG_HOST=0.0.0.0 \
    LIDARSEG_PORT=8000 \
    LIDARSEG_BUILD_DIR=/opt/lidarseg/lib \
    LIDARSEG_KERNEL_BUILD=never
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('LIDARSEG_PORT', '8000'), timeout=4)"]
# tini is PID 1: it passes SIGTERM on to the server (readiness drops, in-flight work drains) and
# reaps orphans; as PID 1, python itself would drop any signal it has no handler for yet (the
# interpreter's first milliseconds; every subcommand but serve). -s: a subreaper where tini is
# not PID 1 (buildah run, docker run --init).
ENTRYPOINT ["/usr/bin/tini", "-s", "--", "python", "-m", "app"]
CMD ["serve"]

FROM runtime-base AS cuda
COPY --from=builder-cuda /opt/venv /opt/venv
COPY --from=builder-cuda /opt/lidarseg/lib /opt/lidarseg/lib
COPY --from=cuda-kernels /opt/lidarseg/lib /opt/lidarseg/lib
COPY --from=builder-cuda /src/ /opt/lidarseg/
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001

FROM runtime-base AS cpu
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /opt/lidarseg/lib /opt/lidarseg/lib
COPY --from=builder /src/ /opt/lidarseg/
USER 10001:10001
