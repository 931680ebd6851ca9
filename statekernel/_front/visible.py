"""Text from a run (a model's words, tool names, arguments, results, errors, stored ids)
as the terminal may show it: control characters escaped, never sent raw.

A model, or a prompt injection in a tool's result, can write escape sequences that
clear the screen, retitle the window or print a hyperlink that opens another address
than it shows; bidi overrides make text read differently than it is stored. Every
place the command prints such text passes it through ``visible`` (or ``plain``, for
rich renderables, whose markup is then never interpreted).
"""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text

__all__ = ["json_text", "plain", "visible"]

_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
"""Arabic letter mark, LRM/RLM, the embeddings and overrides, the isolates."""
_SEPARATORS = (0x2028, 0x2029)
"""Line and paragraph separators: terminals may break lines at them."""
_CONTROLS = (*range(0x00, 0x20), *range(0x7F, 0xA0), *_BIDI, *_SEPARATORS)
"""C0 controls, DEL, C1 controls (0x9b is a one-character CSI), then the above."""


def _escaped(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_ONE_LINE = {code: _escaped(code) for code in _CONTROLS}
_LAYOUT = {code: value for code, value in _ONE_LINE.items() if code not in (0x09, 0x0A)}


def visible(text: str, *, layout: bool = False) -> str:
    """``text`` with every control character written out (``\\x1b``, ``\\x9b``,
    ``\\u202e``): nothing in it moves the cursor or changes the terminal. With
    ``layout`` newlines and tabs stay as they are (blocks of text keep their lines)."""
    return text.translate(_LAYOUT if layout else _ONE_LINE)


def plain(text: str, style: str = "", *, layout: bool = False) -> Text:
    """``visible(text)`` as a rich ``Text``: printed as it is, its markup never read."""
    return Text(visible(text, layout=layout), style=style)


_JSON = {code: f"\\u{code:04x}" for code in _CONTROLS if code >= 0x7F}
"""What JSON itself leaves raw (DEL, C1 controls, bidi, separators) as ``\\uXXXX``."""


def json_text(data: Any, **options: Any) -> str:
    """``json.dumps(data, ensure_ascii=False, **options)`` with the characters JSON
    leaves raw that a terminal acts on (C1 controls such as the one-character CSI, bidi
    overrides, line separators) written as ``\\uXXXX`` escapes: the same JSON value,
    safe to print (only strings can hold them, and there an escape means the same)."""
    return json.dumps(data, ensure_ascii=False, **options).translate(_JSON)
