"""Reading a huge top-level JSON array element by element, so a few questions cost a few reads, not the
whole file, and a file cut off mid-element (the packaged ShareGPT dump is) still yields what is whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

CHUNK = 1 << 20  # characters read at a time


def stream_json_array(path: Path, chunk: int = CHUNK) -> Iterator[object]:
    """Yield the elements of the JSON array in `path`; stops quietly at a truncated last element."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf = f.read(chunk)
        start = buf.find("[")
        if start < 0:
            return
        pos, eof = start + 1, False
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                item, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    return
                more = f.read(chunk)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            yield item
            pos = end
            if pos > chunk:  # drop what was consumed so the buffer stays about one chunk
                buf, pos = buf[pos:], 0
