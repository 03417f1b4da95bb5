#!/bin/sh
# The server image's one entrypoint (docs/image.md):
#   serve [FLAGS]           sparkinfer-api with FLAGS (the default; flags alone mean serve)
#   bench MODE [ARGS]       sparkinfer-bench MODE; an HTTP mode with no --base-url runs against
#                           the server of this container, started here for the run when none
#                           answers on 127.0.0.1:$SPARKINFER_PORT
#   bench code [ARGS]       AR against the embedded model's own block drafter on held-out
#                           code (sparkinfer-bench code), offline; --cpu without a GPU
#   download MODEL          fetch MODEL's checkpoint into /models and check it; no serving
#   healthcheck             exit 0 when /health answers (the image's HEALTHCHECK)
# SPARKINFER_NO_DOWNLOAD=1 forbids downloads (huggingface_hub's HF_HUB_OFFLINE): a checkpoint
# missing from /models is then an error naming its missing files. Any other command runs as is.
set -eu

if [ "${SPARKINFER_NO_DOWNLOAD:-0}" = 1 ]; then
    export HF_HUB_OFFLINE=1
fi
unset SPARKINFER_NO_DOWNLOAD  # the image's switch, not a server setting (those are checked)
port="${SPARKINFER_PORT:-8080}"
health_url="http://127.0.0.1:$port/health"

is_healthy() {
    python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=4)' \
        "$health_url" >/dev/null 2>&1
}

has_flag() {  # has_flag FLAG ARGS...: whether ARGS holds FLAG or FLAG=...
    flag="$1"
    shift
    for arg in "$@"; do
        case "$arg" in "$flag" | "$flag"=*) return 0 ;; esac
    done
    return 1
}

bench_http() {  # an HTTP bench mode against this container's server, started if need be
    if has_flag --base-url "$@" || is_healthy; then
        exec sparkinfer-bench "$@"
    fi
    echo "sparkinfer-entrypoint: no server on 127.0.0.1:$port; starting one for the run" >&2
    sparkinfer-api &
    server=$!
    trap 'kill "$server" 2>/dev/null || true' EXIT INT TERM
    while ! is_healthy; do
        if ! kill -0 "$server" 2>/dev/null; then
            wait "$server" || true
            echo "sparkinfer-entrypoint: the server exited before it was healthy (see above)" >&2
            exit 1
        fi
        sleep 1
    done
    status=0
    sparkinfer-bench "$@" || status=$?
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    exit "$status"
}

cmd="${1:-serve}"
[ "$#" -gt 0 ] && shift
case "$cmd" in
serve) exec sparkinfer-api "$@" ;;
-*) exec sparkinfer-api "$cmd" "$@" ;;
bench)
    mode="${1:-}"
    case "$mode" in
    "" | -h | --help) exec sparkinfer-bench --help ;;
    code)
        shift
        exec sparkinfer-bench code "$@"
        ;;
    serve | diagnose-concurrency | prefill | workloads | determinism | prefix-cache)
        bench_http "$@"
        ;;
    *) exec sparkinfer-bench "$@" ;;
    esac
    ;;
download)
    if [ "$#" -ne 1 ]; then
        echo "usage: download MODEL   (a hub repo id, e.g. Qwen/Qwen3.8-27B)" >&2
        exit 2
    fi
    exec python -m sparkinfer.model.hub "$1"
    ;;
healthcheck) is_healthy ;;
*) exec "$cmd" "$@" ;;
esac
