"""The served engine's API key (scoring/engines/openai.py; docs/scoring.md "Served engines"):
where it is read from, and how it is kept out of every text shown or recorded.

A server may echo the Authorization header it was sent in any form, so a key is removed from a
text wherever it stands in one of these (`pattern`):

- its characters in any case, each as itself, escaped with a backslash (JSON's `\\/`), percent-
  encoded once or twice (`%2F`, `%252F`), quoted-printable (`=3D`), or as a JSON or HTML
  character reference (`\\u002f`, `&#47;`), with whitespace, line breaks, their escapes, soft
  line breaks or invisible characters (a zero-width space, a soft hyphen) between any two;
- the hexadecimal digits of it, of it upper- or lower-cased, or of it URL-quoted;
- inside any base64 text (standard or URL-safe, split into lines or not), the same four: the
  base64 characters that encode the text's bytes alone, at each of the three places a byte can
  start within base64's 3-byte groups. That covers base64 of the key, of `Bearer KEY`, of a whole
  `Authorization: Bearer KEY` line and of anything else holding it; the at most two characters at
  either end that also encode a neighbour's bits stay, 4 bits of the key at most.

A key shorter than KEY_MIN characters is refused before it is sent: the looser forms of so short a
text match ordinary words, and removing them would mangle messages while showing little more than
the key itself.
"""

import base64
import functools
import os
import re
import urllib.parse

VARIABLES = ("KERN_API_KEY", "OPENAI_API_KEY")  # the first one set is the API key
KEY_MIN = 8  # characters: the shortest key accepted (a hosted endpoint's are far longer)
# between two characters of an echoed key: whitespace, a line break, their escapes, an HTML line
# break, a soft line break (quoted-printable's), an invisible character
GAP = r"(?:\s|\\[nrt]|%(?:0[9ad]|20)|<br\s*/?>|=\r?\n|[\u00ad\u200b-\u200d\u2060\ufeff])*"


def api_key():
    """(variable, key) of the first of VARIABLES set, or (None, None)."""
    name = next((v for v in VARIABLES if os.environ.get(v)), None)
    return name, name and os.environ[name]


def keys():
    """(variable, key) of every variable of VARIABLES set to a key that can be told apart from
    other text (KEY_MIN characters or more): each is kept out of what is shown."""
    return [(v, os.environ[v]) for v in VARIABLES if len(os.environ.get(v, "")) >= KEY_MIN]


def character(c):
    """One character of the key as a text may carry it."""
    n = ord(c)
    return "(?:" + "|".join((r"\\?" + re.escape(c), f"%(?:25)?{n:02x}", f"={n:02x}",
                             rf"\\u0*{n:x}", f"&#0*{n};", f"&#x0*{n:x};")) + ")"  # fmt: skip


def spellings(key):
    """The texts whose bytes are encoded whole (hexadecimal, base64): the key, upper- and
    lower-cased, and URL-quoted."""
    return dict.fromkeys((key, key.upper(), key.lower(), urllib.parse.quote(key, safe="")))


def base64_cores(key):
    """The base64 characters that encode `key`'s bytes alone, for each of the three offsets
    (mod 3) the key can start at in the bytes encoded: character i encodes bits [6i, 6i + 6)."""
    data = key.encode()
    for offset in range(3):
        text = base64.b64encode(bytes(offset) + data).decode()
        yield text[-(-8 * offset // 6) : 8 * (offset + len(data)) // 6]


def base64_character(c):
    """A base64 character, in the standard alphabet or the URL-safe one, or percent-encoded."""
    return {"+": r"(?:\+|-|%2[bB])", "/": r"(?:/|_|%2[fF])"}.get(c, re.escape(c))


@functools.lru_cache(maxsize=8)
def pattern(key):
    """Every form of `key` a text may hold (the module's docstring)."""
    plain = "(?i:" + GAP.join(map(character, key)) + ")"
    hexed = ["(?i:" + GAP.join(k.encode().hex()) + ")" for k in spellings(key)]
    spaced = r"(?:\s|\\[nr])*"  # base64 is often cut into lines
    encoded = [spaced.join(map(base64_character, core))
               for k in spellings(key) for core in base64_cores(k)]  # fmt: skip
    return re.compile("|".join([plain, *hexed, *encoded]))


def unkeyed(text):
    """`text` with every key of `keys()`, in every form of `pattern`, replaced by its variable's
    name: a server may echo the Authorization header anywhere in what it says (an OpenAI 401
    does), and in any form."""
    for name, key in keys():
        text = pattern(key).sub(f"${name}", text)
    return text


def shown_url(url):
    """`url` as it is recorded and printed: its scheme, host, port and path alone, without a
    user, password, query or fragment, and every path segment holding a key (in any form)
    replaced by the key's variable's name. Any text is shown somehow: RFC 3986's own regular
    expression splits it (its appendix B), which no text fails."""
    scheme, netloc, path = re.match(r"(?:([^:/?#]+):)?(?://([^/?#]*))?([^?#]*)", url).groups()
    for name, key in keys():  # the key may span segments: marked first, then its segments
        marked = pattern(key).sub(f"${name}", path).split("/")
        path = "/".join(f"${name}" if f"${name}" in s else s for s in marked)
    head = (f"{scheme}:" if scheme is not None else "") + (
        f"//{netloc.rpartition('@')[2]}" if netloc is not None else ""
    )
    return unkeyed(head + path)
