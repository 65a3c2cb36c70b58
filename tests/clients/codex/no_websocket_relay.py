"""A gateway without the WebSocket transport, for Codex over HTTP (run.sh openai_base_url with
CODEX_TRANSPORT=http).

    python3 no_websocket_relay.py LISTEN_PORT TARGET_HOST TARGET_PORT REFUSED_FILE

Relays every TCP connection to TARGET as it is, except a WebSocket upgrade, which gets
`426 Upgrade Required` (one line appended to REFUSED_FILE each time). Codex's built-in `openai`
provider (what `openai_base_url` configures) cannot be told `supports_websockets = false`: on a
426 it falls back to `POST /v1/responses` for the rest of the session. Standard library only.
"""

import asyncio
import sys

LISTEN, HOST, PORT, REFUSED = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def handle(reader, writer):
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        writer.close()
        return
    if b"\r\nupgrade: websocket" in head.lower():
        with open(REFUSED, "a") as f:
            f.write(head.split(b"\r\n", 1)[0].decode("latin-1") + "\n")
        writer.write(b"HTTP/1.1 426 Upgrade Required\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        await writer.drain()
        writer.close()
        return
    up_reader, up_writer = await asyncio.open_connection(HOST, PORT)
    up_writer.write(head)
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", LISTEN)
    async with server:
        await server.serve_forever()


asyncio.run(main())
