# Shell functions that print what the real Claude Code CLI 2.1.197 prints in
# stream-json mode (shapes from shared/reference/claude-cli-2.1.197.md). Texts
# passed in must not contain double quotes or backslashes.
SESSION="${FAKE_SESSION:-9954aa9f-0000-4000-8000-000000000001}"
MODEL="${FAKE_MODEL:-claude-sonnet-4-5}"

init() {
    init_mcp connected connected
}

# init_mcp HYPERHIVE BASH: the init line with these MCP server statuses
# (`connected`, `failed` when a server exits, `pending` when it did not answer
# in time); the real CLI lists every server of its config.
init_mcp() {
    printf '{"type":"system","subtype":"init","cwd":"%s","session_id":"%s","tools":["Edit","Read"],"mcp_servers":[{"name":"hyperhive","status":"%s"},{"name":"bash","status":"%s"}],"model":"%s","permissionMode":"default","apiKeySource":"ANTHROPIC_API_KEY","claude_code_version":"%s","uuid":"u-init"}\n' "$PWD" "$SESSION" "$1" "$2" "$MODEL" "${FAKE_CLAUDE_VERSION:-2.1.197}"
}

# usage_json CTX: a usage object whose context size is CTX.
usage_json() {
    local ctx="${1:-1500}"
    printf '{"input_tokens":%d,"cache_read_input_tokens":0,"cache_creation_input_tokens":0,"output_tokens":1}' "$ctx"
}

# say TEXT [CTX]
say() {
    printf '{"type":"assistant","message":{"id":"msg_fake_%s","type":"message","role":"assistant","model":"%s","content":[{"type":"text","text":"%s"}],"stop_reason":null,"usage":%s,"context_management":null},"parent_tool_use_id":null,"session_id":"%s","uuid":"u-%s"}\n' "${FAKE_N:-0}" "$MODEL" "$1" "$(usage_json "${2:-1500}")" "$SESSION" "$RANDOM"
}

# tool_use NAME INPUT_JSON [CTX]
tool_use() {
    printf '{"type":"assistant","message":{"id":"msg_tool_%s","type":"message","role":"assistant","model":"%s","content":[{"type":"tool_use","id":"toolu_fake_1","name":"%s","input":%s}],"stop_reason":null,"usage":%s,"context_management":null},"parent_tool_use_id":null,"session_id":"%s","uuid":"u-t"}\n' "${FAKE_N:-0}" "$MODEL" "$1" "$2" "$(usage_json "${3:-1500}")" "$SESSION"
    printf '{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_fake_1","type":"tool_result","content":[{"type":"text","text":"sent"}]}]},"parent_tool_use_id":null,"session_id":"%s","uuid":"u-r"}\n' "$SESSION"
}

# tool_call NAME INPUT_JSON [CTX]: a tool_use line alone; the call stays open
# (as while a tool runs) until tool_done prints its result.
tool_call() {
    printf '{"type":"assistant","message":{"id":"msg_call_%s","type":"message","role":"assistant","model":"%s","content":[{"type":"tool_use","id":"toolu_fake_open","name":"%s","input":%s}],"stop_reason":null,"usage":%s,"context_management":null},"parent_tool_use_id":null,"session_id":"%s","uuid":"u-tc"}\n' "${FAKE_N:-0}" "$MODEL" "$1" "$2" "$(usage_json "${3:-1500}")" "$SESSION"
}

# tool_done: the result of the call tool_call opened.
tool_done() {
    printf '{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_fake_open","type":"tool_result","content":[{"type":"text","text":"done"}]}]},"parent_tool_use_id":null,"session_id":"%s","uuid":"u-td"}\n' "$SESSION"
}

# result_ok TEXT
result_ok() {
    printf '{"type":"result","subtype":"success","is_error":false,"api_error_status":null,"duration_ms":107,"num_turns":2,"result":"%s","stop_reason":"end_turn","session_id":"%s","total_cost_usd":0.014,"usage":{"input_tokens":2400,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":84},"modelUsage":{"%s":{"inputTokens":2400,"outputTokens":84,"contextWindow":200000,"maxOutputTokens":32000}},"permission_denials":[],"terminal_reason":"completed","uuid":"u-res"}\n' "$1" "$SESSION" "$MODEL"
}

# result_shutdown TEXT: the success result newer CLIs print when a shutdown
# interrupted the turn (`interrupted_by_shutdown`, a field 2.1.197 does not
# print yet).
result_shutdown() {
    printf '{"type":"result","subtype":"success","is_error":false,"api_error_status":null,"duration_ms":107,"num_turns":2,"result":"%s","stop_reason":"end_turn","session_id":"%s","total_cost_usd":0.014,"usage":{"input_tokens":2400,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":84},"modelUsage":{},"permission_denials":[],"terminal_reason":"completed","interrupted_by_shutdown":true,"uuid":"u-res"}\n' "$1" "$SESSION"
}

# ok_turn TEXT [CTX]: a whole successful turn, exit 0.
ok_turn() {
    init
    say "$1" "${2:-1500}"
    result_ok "$1"
    exit 0
}

# api_error STATUS ERROR TEXT [TERMINAL_REASON]: the real CLI's failed turn, exit 1.
api_error() {
    local status="$1" error="$2" text="$3" reason="${4:-completed}"
    [ "$status" = null ] || status="$status"
    init
    printf '{"type":"assistant","message":{"id":"synthetic-%s","model":"<synthetic>","role":"assistant","stop_reason":"stop_sequence","type":"message","usage":{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0},"content":[{"type":"text","text":"%s"}],"context_management":null},"parent_tool_use_id":null,"session_id":"%s","uuid":"u-e","error":"%s","request_id":"req_fake"}\n' "$RANDOM" "$text" "$SESSION" "$error"
    printf '{"type":"result","subtype":"success","is_error":true,"api_error_status":%s,"duration_ms":86,"num_turns":1,"result":"%s","stop_reason":"stop_sequence","session_id":"%s","total_cost_usd":0,"usage":{"input_tokens":0,"output_tokens":0},"modelUsage":{},"permission_denials":[],"terminal_reason":"%s","uuid":"u-r"}\n' "$status" "$text" "$SESSION" "$reason"
    exit 1
}

# api_retry STATUS ERROR: one retry notice as the CLI prints it before retrying.
api_retry() {
    printf '{"type":"system","subtype":"api_retry","attempt":1,"max_retries":2,"retry_delay_ms":547.5,"error_status":%s,"error":"%s","session_id":"%s","uuid":"u-ar"}\n' "$1" "$2" "$SESSION"
}

# rate_limit_event RESETS_AT: the OAuth rate-limit notice.
rate_limit_event() {
    printf '{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":%s,"rateLimitType":"five_hour","isUsingOverage":false},"session_id":"%s","uuid":"u-rl"}\n' "$1" "$SESSION"
}

# compact_ok PRE POST: a successful /compact, exit 0.
compact_ok() {
    printf '{"type":"system","subtype":"status","status":"compacting","session_id":"%s","uuid":"u-s1"}\n' "$SESSION"
    printf '{"type":"system","subtype":"status","status":null,"compact_result":"success","session_id":"%s","uuid":"u-s2"}\n' "$SESSION"
    init
    printf '{"type":"system","subtype":"compact_boundary","session_id":"%s","uuid":"u-cb","compact_metadata":{"trigger":"manual","pre_tokens":%s,"post_tokens":%s,"cumulative_dropped_tokens":0,"duration_ms":38}}\n' "$SESSION" "$1" "$2"
    printf '{"type":"user","message":{"role":"user","content":"<local-command-stdout>Compacted </local-command-stdout>"},"session_id":"%s","uuid":"u-cu","isReplay":true}\n' "$SESSION"
    printf '{"type":"result","subtype":"success","is_error":false,"duration_ms":48,"num_turns":0,"result":"","stop_reason":null,"session_id":"%s","total_cost_usd":0.000375,"usage":{"input_tokens":0,"output_tokens":0},"modelUsage":{},"permission_denials":[],"uuid":"u-cr"}\n' "$SESSION"
    exit 0
}

# compact_failed MESSAGE: a failed /compact, which still exits 0.
compact_failed() {
    printf '{"type":"system","subtype":"status","status":null,"compact_result":"failed","compact_error":"%s","session_id":"%s","uuid":"u-cf"}\n' "$1" "$SESSION"
    init
    printf '{"type":"assistant","message":{"id":"synthetic-cf","model":"<synthetic>","role":"assistant","type":"message","usage":{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0},"content":[{"type":"text","text":"%s"}]},"parent_tool_use_id":null,"session_id":"%s","uuid":"u-cfa"}\n' "$1" "$SESSION"
    printf '{"type":"result","subtype":"success","is_error":false,"duration_ms":40,"num_turns":0,"result":"%s","session_id":"%s","total_cost_usd":0,"usage":{"input_tokens":0,"output_tokens":0},"modelUsage":{},"permission_denials":[],"uuid":"u-cfr"}\n' "$1" "$SESSION"
    exit 0
}

# aborted: what the CLI prints after SIGINT mid-tool, exit 0.
aborted() {
    printf '{"type":"result","subtype":"error_during_execution","is_error":true,"api_error_status":null,"duration_ms":900,"num_turns":1,"session_id":"%s","total_cost_usd":0,"usage":{"input_tokens":0,"output_tokens":0},"modelUsage":{},"permission_denials":[],"terminal_reason":"aborted_tools","uuid":"u-ab"}\n' "$SESSION"
    exit 0
}
