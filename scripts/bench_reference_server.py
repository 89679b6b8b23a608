"""The benchmark's reference: the MCP SDK's own Streamable HTTP server, served by uvicorn.

A lowlevel ``mcp.server.Server`` with a ``calculate`` tool (same name and input schema as the
sidecar built-in; it evaluates a small arithmetic expression) and, with ``--echo``, an ``echo(text)``
tool (the echo fixture's, served by the SDK itself: what a proxy of that fixture is compared with),
exposed with the SDK's defaults:
``server.streamable_http_app()`` (stateful, SSE answers for the 2025 era, JSON for 2026-07-28, the
SDK's own DNS-rebinding protection for 127.0.0.1, default OpenTelemetry middleware) under uvicorn.
Nothing here is tuned: it is "what the SDK gives you".

    python scripts/bench_reference_server.py --port 0   # prints "LISTENING <port>" once it accepts
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import math
import operator
import socket
import sys
from typing import Any

import uvicorn
from mcp import types
from mcp.server import Server, ServerRequestContext

_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}

INPUT_SCHEMA = {
    "type": "object",
    "properties": {"expression": {"type": "string", "maxLength": 1000}},
    "required": ["expression"],
}

ECHO_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))  # type: ignore[no-any-return]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))  # type: ignore[no-any-return]
    if isinstance(node, ast.Name) and node.id == "pi":
        return math.pi
    raise ValueError("unsupported expression")


def build_server(*, echo: bool = False) -> Server[Any]:
    echo_tool = types.Tool(name="echo", description="Return the text unchanged.", input_schema=ECHO_SCHEMA)
    echo_tools = [echo_tool] if echo else []

    async def on_list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                *echo_tools,
                types.Tool(
                    name="calculate",
                    title="Calculator",
                    description="Evaluate an arithmetic expression.",
                    input_schema=INPUT_SCHEMA,
                ),
            ]
        )

    async def on_call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name == "echo" and echo:
            text = str((params.arguments or {}).get("text", ""))
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)])
        if params.name != "calculate":
            return types.CallToolResult(content=[types.TextContent(type="text", text="unknown tool")], is_error=True)
        try:
            value = _eval(ast.parse(str((params.arguments or {})["expression"]), mode="eval"))
        except (KeyError, SyntaxError, ValueError, ArithmeticError) as exc:
            return types.CallToolResult(content=[types.TextContent(type="text", text=str(exc))], is_error=True)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=str(value))],
            structured_content={"result": value},
        )

    return Server("bench-reference", version="1", on_list_tools=on_list_tools, on_call_tool=on_call_tool)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 = any free port)")
    parser.add_argument("--echo", action="store_true", help="serve the echo fixture's echo(text) tool too")
    args = parser.parse_args(argv)

    # uvicorn binds the socket itself, exactly as ``uvicorn.run(app, host=..., port=...)`` would (a socket
    # handed in from outside would need proto=IPPROTO_TCP, or asyncio skips TCP_NODELAY: +40 ms a call).
    app = build_server(echo=args.echo).streamable_http_app(host="127.0.0.1")
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)

    async def run() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started:
            if task.done():
                task.result()
                return
            await asyncio.sleep(0.01)
        port = next(
            sock.getsockname()[1] for srv in server.servers for sock in srv.sockets if sock.family == socket.AF_INET
        )
        print(f"LISTENING {port}", flush=True)
        await task

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
