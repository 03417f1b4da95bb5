#!/bin/sh
# The image's virtual environment (/app/.venv), in two steps so the dependencies are a layer of
# their own: `build-venv.sh dependencies VARIANT`, then `build-venv.sh workspace VARIANT`.
# Everything comes from uv.lock (`uv sync --locked`, no dev groups). VARIANT cpu leaves out the
# locked CUDA torch and the CUDA wheels it pulls in, puts torch's CPU wheel in its place, and
# drops Triton's GPU tool binaries (the CPU runs no Triton kernel; `import triton` still works).
set -eu
step="$1"
variant="$2"
case "$variant" in gpu | cpu) ;; *) echo "VARIANT is '$variant'; expected gpu or cpu" >&2; exit 2 ;; esac

skip=""
if [ "$variant" = cpu ]; then
    # The locked torch and the CUDA wheels (nvidia-*, cuda-*), by name, from the lock itself.
    for name in $(uv export --locked --no-dev --no-hashes --no-emit-workspace --no-header \
        | sed -n 's/^\(torch\|nvidia-[a-z0-9-]*\|cuda-[a-z0-9-]*\)==.*/\1/p'); do
        skip="$skip --no-install-package $name"
    done
fi

case "$step" in
dependencies)
    # shellcheck disable=SC2086
    uv sync --locked --no-dev --no-editable --no-install-workspace $skip
    ;;
workspace)
    # shellcheck disable=SC2086
    uv sync --locked --no-dev --no-editable $skip
    site=$(/app/.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if [ "$variant" = cpu ]; then
        locked=$(uv export --locked --no-dev --no-hashes --no-header | sed -n 's/^torch==\([^ ;]*\).*/\1/p')
        version="${TORCH_CPU_VERSION:-$locked}"
        if [ -n "${TORCH_CPU_WHEELS:-}" ]; then
            source="--no-index --find-links $TORCH_CPU_WHEELS"
        else
            source="--index-url $TORCH_CPU_INDEX"
        fi
        # shellcheck disable=SC2086
        uv pip install --python /app/.venv/bin/python --no-deps $source "torch==$version"
        # Triton's GPU tool binaries (ptxas, CUPTI, the AMD code generator) are used only when it
        # compiles or profiles for a GPU; its Python modules stay, for `import triton`.
        backends="$site/triton/backends"
        rm -rf "$backends/nvidia/bin" "$backends/nvidia/lib/cupti" \
            "$backends/nvidia/lib/cupti-blackwell" "$backends/amd/lib/libtriton_amd_codegen.so"
    fi
    # Some wheels ship their shared libraries with debug information (Triton's: half its size);
    # the server never reads it.
    find "$site" -name '*.so*' -type f | while read -r lib; do
        if readelf -S --wide "$lib" 2>/dev/null | grep -q '\.debug_info'; then
            strip --strip-debug "$lib"
        fi
    done
    /app/.venv/bin/python -c 'import sparkinfer.api.main, sparkinfer.bench.__main__, torch; print("torch", torch.__version__)'
    ;;
*)
    echo "step is '$step'; expected dependencies or workspace" >&2
    exit 2
    ;;
esac
