# Sourced by the scripts that start a `vllm serve`: wait_for_server PID PORT LOG SECONDS returns once
# the server at 127.0.0.1:PORT answers /health, and exits 1 with the end of LOG if process PID dies first
# or SECONDS pass without an answer.
wait_for_server() {
    local pid=$1 port=$2 log=$3 seconds=$4
    for _ in $(seq "$seconds"); do
        curl -sf "http://127.0.0.1:$port/health" > /dev/null && return 0
        kill -0 "$pid" 2>/dev/null || { tail -20 "$log"; exit 1; }
        sleep 1
    done
    echo "the server (pid $pid) did not answer http://127.0.0.1:$port/health within $seconds s" >&2
    tail -20 "$log"
    exit 1
}
