"""One table of pin-file lines, each with the verdict that build.py and fetch.sh must both give
(docs/building.md "The pin files" is the grammar; tests/test_pin_grammar.py runs both on it).

A row is (file, line, refusal): the line's bytes without its LF, and None where both scripts
accept the line, or a word that each script's refusal must contain. `{n}` in a line is replaced by
the row's number, so that no two rows pin the same file. PAIRS are two lines that are each fine
alone, and the verdict on the second once the first is read (REV is read before BOOKS).
"""

import unicodedata

SHA = "0123456789abcdef" * 4
REV = "dataset  org/r{n}  0f1e2d3c  data/f{n}.json  12  " + SHA
BOOK = "7  en  books/b{n}  0f1e2d3c  b{n}.txt  12  -  A. Author, A Title"


def rev(text, refusal=None):
    return ("REV", text.encode() if isinstance(text, str) else text, refusal)


def book(text, refusal=None):
    return ("BOOKS", text.encode() if isinstance(text, str) else text, refusal)


def in_path(char):
    """REV with char inside the path."""
    return REV.replace("data/f{n}", "data/f" + char + "{n}")


# Every character no line may hold, comments included: the control characters but tab (LF ends
# the line) and what Python calls white space but space and tab.
FORBIDDEN = [
    c
    for c in map(chr, range(0x110000))
    if (unicodedata.category(c) == "Cc" or c.isspace()) and c not in " \t\n"
]

ROWS = [
    # Accepted.
    rev(REV),
    rev(REV.replace("  ", "\t")),
    rev(" \t " + REV + " \t"),
    rev(REV + "  # a comment, with # in it"),
    rev(REV + "\r"),  # a CRLF line end
    rev(REV.replace("dataset", "model")),
    rev(REV.replace(" 12 ", " 0 ")),
    rev(REV.replace(" 12 ", " " + "9" * 18 + " ")),
    rev(REV.replace(SHA, "-")),
    rev(REV.replace(" 12 ", " - ").replace(SHA, "-")),
    rev(REV.replace("0f1e2d3c", "a..b")),
    rev(REV.replace("data/f{n}", "données/ü{n}")),
    rev(REV.replace("data/f{n}", "a*b[c]{n}")),  # literal: never a pattern
    rev(REV.replace("data/f{n}", "a\\b{n}")),
    rev(in_path("\u200b")),  # zero width space: not white space
    rev(in_path("\ufeff")),
    rev(in_path("\u00ad")),
    rev(in_path("\U0001f600")),
    rev(""),
    rev("   \t "),
    rev("# kind repo revision path bytes sha256"),
    rev("   # café, 水滸傳"),
    rev("#\ta tab in a comment"),
    book(BOOK),
    book(BOOK.replace(" en ", " zh ").replace("A. Author, A Title", "施耐庵《水滸傳》")),
    book(BOOK.replace("A. Author, A Title", "One")),
    book(BOOK.replace("A. Author, A Title", "A  spaced \t title")),
    book(BOOK + "  # and a comment"),
    book(BOOK.replace(" 12  - ", " -  " + SHA + " ")),
    book(BOOK + "\r"),
    # Refused: columns.
    rev(REV.rsplit(None, 1)[0], "columns"),
    rev(REV + " extra", "columns"),
    rev(REV.replace("  " + SHA, "  # " + SHA), "columns"),
    rev("dataset", "columns"),
    book(BOOK.replace("  A. Author, A Title", ""), "columns"),  # no title
    book(BOOK.replace("  A. Author", "  # A. Author"), "columns"),
    # Refused: a value.
    rev(REV.replace("dataset", "Dataset"), "kind"),
    rev(REV.replace("dataset", "datasets"), "kind"),
    rev(REV.replace(" 12 ", " 12a "), "bytes"),
    rev(REV.replace(" 12 ", " -1 "), "bytes"),
    rev(REV.replace(" 12 ", " +1 "), "bytes"),
    rev(REV.replace(" 12 ", " " + "9" * 19 + " "), "bytes"),
    rev(REV.replace(" 12 ", " ١٢ "), "bytes"),  # Arabic-Indic digits
    rev(REV.replace(SHA, SHA.upper()), "sha256"),
    rev(REV.replace(SHA, SHA[:63]), "sha256"),
    rev(REV.replace(SHA, SHA + "0"), "sha256"),
    rev(REV.replace(SHA, "--"), "sha256"),
    rev(REV.replace(SHA, "g" * 64), "sha256"),
    book(BOOK.replace("7  en", "x7  en"), "ebook"),
    book(BOOK.replace("7  en", "-  en"), "ebook"),
    book(BOOK.replace(" en ", " EN "), "lang"),
    book(BOOK.replace(" en ", " fr "), "lang"),
    book(BOOK.replace(" en ", " en-GB "), "lang"),
    # Refused: what cannot be a path.
    rev(REV.replace("org/r{n}", "/org/r{n}"), "repo"),
    rev(REV.replace("org/r{n}", "org/../r{n}"), "repo"),
    rev(REV.replace("org/r{n}", "org//r{n}"), "repo"),
    rev(REV.replace("0f1e2d3c", "a/../b"), "revision"),
    rev(REV.replace("0f1e2d3c", "."), "revision"),
    rev(REV.replace("data/f{n}.json", "../f{n}.json"), "path"),
    rev(REV.replace("data/f{n}.json", "/etc/f{n}"), "path"),
    rev(REV.replace("data/f{n}.json", "data/./f{n}"), "path"),
    rev(REV.replace("data/f{n}.json", "data/f{n}/"), "path"),
    book(BOOK.replace("b{n}.txt", "../../b{n}.txt"), "path"),
    book(BOOK.replace("books/b{n}", "/books/b{n}"), "repo"),
    # Refused: bytes and characters, anywhere in the line.
    rev(REV.replace("dataset  ", "dataset\u00a0"), "U+00A0"),  # a no-break space as separator
    rev(REV.replace("  ", "\u3000"), "U+3000"),
    rev(in_path("\r"), "U+000D"),  # a carriage return inside a path
    rev(REV + "\r\r", "U+000D"),
    rev(in_path("\0"), "U+0000"),
    rev(REV + " # \0", "U+0000"),
    rev(b"# caf\xe9", "UTF-8"),  # a Latin-1 byte in a comment
    rev(in_path("").replace("data/f", "data/\xe9").encode("latin-1"), "UTF-8"),
    rev(REV.encode() + b" # \xc0\xaf", "UTF-8"),  # an overlong "/"
    rev(REV.encode() + b" # \xed\xa0\x80", "UTF-8"),  # a surrogate
    rev(REV.encode() + b" # \xf4\x90\x80\x80", "UTF-8"),  # past U+10FFFF
    rev(REV.encode() + b" # \xe6\xb0", "UTF-8"),  # cut short
    rev(b"\xff\xfe# " + REV.encode(), "UTF-8"),
    book(BOOK.replace("A Title", "A\u00a0Title"), "U+00A0"),
    book(BOOK.encode().replace(b"A Title", b"A T\xeftle"), "UTF-8"),
    # Every character no line may hold: in a path, and in a comment.
    *(rev(in_path(c), f"U+{ord(c):04X}") for c in FORBIDDEN),
    *(rev("# a " + c + " comment", f"U+{ord(c):04X}") for c in FORBIDDEN),
]

PAIRS = [
    # (first, second, refusal of the second)
    (rev(REV), rev(REV), "already pinned"),
    (rev(REV), rev(REV.replace("0f1e2d3c", "other").replace("dataset", "model")), "already"),
    (rev(REV), book("1  en  org/r{n}  c0ffee  data/f{n}.json  -  -  T"), "already pinned"),
    (rev(REV), rev(REV.replace("f{n}.json", "f{n}.json.part")), "collides"),
    (rev(REV.replace("f{n}.json", "f{n}.json.part")), rev(REV), "collides"),
    (rev(REV), rev(REV.replace("f{n}.json", "f{n}.json/x")), "collides"),
    (rev(REV), rev(REV.replace("data/f{n}.json", "data")), "collides"),
    (rev(REV), book("1  en  org/r{n}/data/f{n}.json  c  x.txt  -  -  T"), "collides"),
    (rev(REV), rev(REV.replace("f{n}.json", "g{n}.json")), None),
    (rev(REV), rev(REV.replace("org/r{n}", "org/s{n}")), None),
    (rev(REV), rev(REV.replace("f{n}.json", "f{n}.jsonpart")), None),
    (book(BOOK), book(BOOK.replace("b{n}.txt", "c{n}.txt")), None),
]


def numbered(line: bytes, n: int) -> bytes:
    return line.replace(b"{n}", str(n).encode())
