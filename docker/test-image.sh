#!/bin/sh
# Build the CPU image and check it for real (minutes, so not part of `uv run pytest`):
#   - the container serves the embedded default and turns healthy (the image's HEALTHCHECK);
#   - the official openai client gets a chat completion, a stream and a tool call;
#   - the server runs as a non-root user;
#   - `bench serve` works from inside the container against it, `bench code --cpu` offline;
#   - `download` fills /models from a local fake hub (HF_ENDPOINT), a second container serves
#     that hub id from the volume with SPARKINFER_NO_DOWNLOAD=1, and an absent one is a clear error.
# Usage (repository root): sh docker/test-image.sh
#   CONTAINER=podman|docker   the runtime (default: podman)
#   IMAGE=NAME                test this image instead of building one
#   BUILD_ARGS="..."          extra `build` arguments (a local base: see docker/local-base.sh)
# It needs the runtime, uv (for the client and the fake hub) and host networking.
set -eu
cli="${CONTAINER:-podman}"
if ! command -v "$cli" >/dev/null 2>&1 || ! "$cli" info >/dev/null 2>&1; then
    echo "SKIP: no working container runtime ($cli)" >&2
    exit 0
fi
tag="${IMAGE:-localhost/sparkinfer:cpu-test}"
port="${PORT:-18080}"
hub_port="${HUB_PORT:-18765}"
name="sparkinfer-test-$$"
volume="sparkinfer-test-models-$$"
work="$(mktemp -d)"
hub_pid=""
cleanup() {
    "$cli" rm -f "$name" "$name-hub" >/dev/null 2>&1 || true
    "$cli" volume rm -f "$volume" >/dev/null 2>&1 || true
    if [ -n "$hub_pid" ]; then kill "$hub_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
step() { printf '\n== %s (%ss)\n' "$1" "$(($(date +%s) - t0))"; }
t0=$(date +%s)

if [ -z "${IMAGE:-}" ]; then
    step "build the CPU variant"
    format=""
    [ "$cli" = podman ] && format="--format docker"  # keeps HEALTHCHECK
    # shellcheck disable=SC2086
    "$cli" build $format --network=host -f docker/Dockerfile --build-arg VARIANT=cpu \
        ${BUILD_ARGS:-} -t "$tag" .
fi
"$cli" image inspect --format '{{.Size}}' "$tag" | awk '{printf "image size: %.2f GB\n", $1 / 1e9}'

wait_healthy() {  # wait_healthy CONTAINER SECONDS
    i=0
    while [ "$i" -lt "$2" ]; do
        if [ "$cli" = podman ]; then
            podman healthcheck run "$1" >/dev/null 2>&1 && return 0
        elif [ "$("$cli" inspect --format '{{.State.Health.Status}}' "$1")" = healthy ]; then
            return 0
        fi
        if [ "$("$cli" inspect --format '{{.State.Running}}' "$1")" != true ]; then
            "$cli" logs "$1" >&2
            echo "FAIL: $1 exited before it was healthy" >&2
            exit 1
        fi
        sleep 2
        i=$((i + 2))
    done
    "$cli" logs "$1" >&2
    echo "FAIL: $1 not healthy after $2 s" >&2
    exit 1
}

step "serve the embedded default"
"$cli" run -d --name "$name" --network=host -e SPARKINFER_PORT="$port" "$tag" >/dev/null
wait_healthy "$name" 300
echo "healthy"

step "non-root"
uid=$("$cli" exec "$name" id -u)
[ "$uid" != 0 ] || { echo "FAIL: the server runs as root" >&2; exit 1; }
echo "uid $uid ($("$cli" exec "$name" id -un))"

step "openai client: chat, stream, tools"
uv run --no-sync python - "http://127.0.0.1:$port/v1" <<'EOF'
import sys

from openai import OpenAI

client = OpenAI(base_url=sys.argv[1], api_key="unused")
model = client.models.list().data[0].id
messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
chat = client.chat.completions.create(model=model, messages=messages, max_tokens=48)
assert chat.choices[0].message.content, chat
print(f"chat ({model}):", repr(chat.choices[0].message.content[:80]))
pieces = [
    c.choices[0].delta.content or ""
    for c in client.chat.completions.create(
        model=model, messages=messages, max_tokens=32, stream=True
    )
    if c.choices
]
assert len(pieces) > 1 and "".join(pieces), pieces
print(f"stream: {len(pieces)} chunks", repr("".join(pieces)[:80]))
tool = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
reply = client.chat.completions.create(
    model=model, messages=ask, tools=[tool], tool_choice="required", max_tokens=64
)
calls = reply.choices[0].message.tool_calls
assert calls and calls[0].function.name == "get_weather", reply
print("tool call:", calls[0].function.name, calls[0].function.arguments)
EOF

step "bench serve from inside the container"
"$cli" exec "$name" sparkinfer-entrypoint bench serve --base-url "http://127.0.0.1:$port" \
    --concurrency 1,2 --input-len 32 --output-len 16 --num-prompts 8 --warmup 1 --out /tmp/bench
"$cli" rm -f "$name" >/dev/null

step "bench code, offline: the embedded model and its drafter on the CPU"
"$cli" run --rm "$tag" bench code --cpu --num-speculative-tokens 7 --context 128 \
    --new-tokens 16 --out /tmp/bench | grep -E "^ *(drafter|dflash) "

step "download from a fake hub into /models"
uv run --no-sync python packages/model/tests/fake_hub.py --port "$hub_port" \
    "sparkinfer-test/embedded=packages/model/src/sparkinfer/model/embedded_checkpoint" &
hub_pid=$!
sleep 3
"$cli" volume create "$volume" >/dev/null
"$cli" run --rm --network=host -e HF_ENDPOINT="http://127.0.0.1:$hub_port" \
    -v "$volume:/models" "$tag" download sparkinfer-test/embedded
"$cli" run --rm -v "$volume:/models" "$tag" \
    sh -c 'ls /models/hub/models--sparkinfer-test--embedded/snapshots/*/'

step "serve the downloaded hub id offline (SPARKINFER_NO_DOWNLOAD=1)"
"$cli" run -d --name "$name-hub" --network=host -e SPARKINFER_PORT="$port" \
    -e SPARKINFER_NO_DOWNLOAD=1 -v "$volume:/models" "$tag" --model sparkinfer-test/embedded \
    >/dev/null
wait_healthy "$name-hub" 300
python3 -c 'import json, sys, urllib.request
ids = [m["id"] for m in json.load(urllib.request.urlopen(sys.argv[1]))["data"]]
assert ids == ["sparkinfer-test/embedded"], ids
print("serving", ids)' "http://127.0.0.1:$port/v1/models"
"$cli" rm -f "$name-hub" >/dev/null

step "SPARKINFER_NO_DOWNLOAD=1 with a model not in /models"
if "$cli" run --rm -e SPARKINFER_NO_DOWNLOAD=1 -v "$volume:/models" "$tag" \
    download sparkinfer-test/absent 2>"$work/err"; then
    echo "FAIL: download of an absent model succeeded offline" >&2
    exit 1
fi
grep -q 'python -m sparkinfer.model.hub sparkinfer-test/absent' "$work/err" \
    || { cat "$work/err" >&2; echo "FAIL: the error names no fetch command" >&2; exit 1; }
tail -n 1 "$work/err"

step "PASS"
