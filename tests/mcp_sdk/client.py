"""Drives `hive mcp` with the official MCP Python SDK as the client, over stdio.

Run by tests/mcp_python_sdk.rs with: HIVE_BIN SOCKET STATE_DIR QUEUED_ID. The
broker already holds one message from the operator to this agent (QUEUED_ID).
Every check raises with what was expected and what came back; the script
prints one line per passed step and exits 0 when all passed.
"""

import asyncio
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared import exceptions

# The SDK renamed its error class in 2.x; accept either.
MCPError = getattr(exceptions, "MCPError", None) or getattr(exceptions, "McpError")

DEFAULT_TOOLS = [
    "send", "recv", "ask", "answer", "message_state", "set_status", "get_agent_meta",
    "get_loose_ends", "cancel_loose_end", "remind", "request_next_turn",
]

STEP_TIMEOUT = 20


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def field(obj, camel, snake):
    """Reads a result field by its 1.x (camelCase) or 2.x (snake_case) name."""
    return getattr(obj, camel, None) if hasattr(obj, camel) else getattr(obj, snake)


def text(result):
    return "\n".join(b.text for b in result.content if getattr(b, "type", "") == "text")


async def ok(session, name, args):
    r = await asyncio.wait_for(session.call_tool(name, args), STEP_TIMEOUT)
    check(not field(r, "isError", "is_error"), f"{name}({args}) failed: {text(r)}")
    print(f"ok {name}: {text(r)!r}", flush=True)
    return text(r)


async def tool_error(session, name, args):
    r = await asyncio.wait_for(session.call_tool(name, args), STEP_TIMEOUT)
    check(field(r, "isError", "is_error"), f"{name}({args}) should be a tool error, got: {text(r)}")
    print(f"ok {name} isError: {text(r)!r}", flush=True)
    return text(r)


async def bad_arguments(session, name, args, want):
    """Wrong arguments are a result the model reads (isError), whose text names
    the argument, quotes the value and says what is allowed."""
    text_got = await tool_error(session, name, args)
    check(text_got == want, f"{name}: {text_got!r}, want {want!r}")


async def invalid_params(session, name, args, want):
    try:
        r = await asyncio.wait_for(session.call_tool(name, args), STEP_TIMEOUT)
    except MCPError as e:
        check(e.error.code == -32602, f"{name}: code {e.error.code}, want -32602")
        check(e.error.message == want, f"{name}: message {e.error.message!r}, want {want!r}")
        print(f"ok {name} -32602: {want!r}", flush=True)
        return
    raise AssertionError(f"{name}({args}) should raise -32602, got {r}")


async def main():
    hive, socket, state, queued = sys.argv[1:5]
    params = StdioServerParameters(
        command=hive,
        args=["mcp"],
        env={
            "HIVE_SOCKET": socket,
            "HIVE_STATE_DIR": state,
            "RUST_LOG": "warn",
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        },
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await asyncio.wait_for(session.initialize(), STEP_TIMEOUT)
            info = field(init, "serverInfo", "server_info")
            check(info.name == "hyperhive", f"server name {info.name}")
            print(f"ok initialize: {info.name} {field(init, 'protocolVersion', 'protocol_version')}", flush=True)

            listed = await asyncio.wait_for(session.list_tools(), STEP_TIMEOUT)
            names = [t.name for t in listed.tools]
            check(names == DEFAULT_TOOLS, f"tools/list gave {names}")
            for t in listed.tools:
                schema = field(t, "inputSchema", "input_schema")
                check(schema["type"] == "object", f"{t.name} schema {schema}")
                check(len(t.description) > 60, f"{t.name} description {t.description!r}")
            print(f"ok tools/list: {names}", flush=True)

            got = await ok(session, "recv", {"max": 5})
            check(got == f"#{queued} from operator (message): queued for python", got)
            check(await ok(session, "recv", {}) == "no messages", "inbox should be empty")

            sent = await ok(session, "send", {"to": "operator", "body": "from the python sdk"})
            check(sent.endswith(" to operator"), sent)
            sid = int(sent.split("#")[1].split(" ")[0])
            st = await ok(session, "message_state", {"id": sid})
            check(st.startswith(f"message #{sid} to operator: queued, position "), st)
            await tool_error(session, "message_state", {"id": sid + 1000})
            await tool_error(session, "send", {"to": "nobody", "body": "x"})
            await bad_arguments(session, "send", {"body": "x"},
                                 'missing required argument "to" (a string)')

            asked = await ok(session, "ask", {"question": "python?", "options": ["yes", "no"]})
            qid = int(asked.split("#")[1].split(" ")[0])
            ends = await ok(session, "get_loose_ends", {})
            check(f"question #{qid} asked to operator: python?" in ends, ends)
            await ok(session, "cancel_loose_end", {"kind": "question", "id": qid})
            await tool_error(session, "answer", {"id": qid, "answer": "x"})
            await bad_arguments(session, "answer", {"id": "x", "answer": "y"},
                                 'argument "id" must be an integer, got "x"')

            reminded = await ok(session, "remind", {"message": "ping me", "delay_seconds": 1})
            check(reminded.startswith("reminder #"), reminded)
            fired = await ok(session, "recv", {"wait_seconds": 10})
            check("(reminder): [reminder #" in fired and fired.endswith("ping me"), fired)

            await ok(session, "set_status", {"text": "testing with python"})
            meta = await ok(session, "get_agent_meta", {})
            check('"status_text": "testing with python"' in meta, meta)
            await bad_arguments(session, "set_status", {"text": "two\nlines"},
                                 'argument "text" must be one line of at most 200 characters, got 9 characters')
            await ok(session, "request_next_turn", {})
            await invalid_params(session, "kill", {}, "unknown tool: kill")
    print("ALL OK", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
