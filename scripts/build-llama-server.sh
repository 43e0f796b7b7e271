#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (the `llama` regeneration backend's engine) from the llama.cpp
# source vendored in the `llama-cpp-python` sdist on PyPI: no prebuilt binary, no download at run
# time. Installs into DEST (default ~/.cache/specforge-outlets/llama.cpp-$VERSION), so a rebuild
# happens once per machine, not once per clone. About 10 minutes on 2 cores.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
DEST="${1:-${HOME}/.cache/specforge-outlets/llama.cpp-${VERSION}}"
PYTHON="${PYTHON:-python3}"
if [ -x "${DEST}/bin/llama-server" ]; then
  echo "llama-server ${VERSION}: ${DEST}/bin/llama-server (already built)"
  exit 0
fi
WORK="$(mktemp -d)"
trap 'rm -rf "${WORK}"' EXIT
"${PYTHON}" -m pip --disable-pip-version-check -q download --no-deps --no-binary :all: \
  "llama-cpp-python==${VERSION}" -d "${WORK}"
tar xzf "${WORK}/llama_cpp_python-${VERSION}.tar.gz" -C "${WORK}"
SRC="${WORK}/llama_cpp_python-${VERSION}/vendor/llama.cpp"
# No web UI (its prebuilt copy would be fetched from a hub), no TLS, no curl: a local HTTP engine.
cmake -S "${SRC}" -B "${WORK}/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DCMAKE_INSTALL_PREFIX="${DEST}.partial" >"${WORK}/cmake.log" 2>&1 \
  || { tail -40 "${WORK}/cmake.log"; exit 1; }
echo "building llama-server ${VERSION} (about 10 minutes on 2 cores) ..."
cmake --build "${WORK}/build" --target llama-server -j "$(nproc)" >"${WORK}/build.log" 2>&1 \
  || { tail -40 "${WORK}/build.log"; exit 1; }
mkdir -p "${DEST}.partial/bin"
cp "${WORK}/build/bin/llama-server" "${DEST}.partial/bin/"
rm -rf "${DEST}" && mv "${DEST}.partial" "${DEST}"
echo "llama-server ${VERSION}: ${DEST}/bin/llama-server"
