"""Project Gutenberg books: boilerplate removed, the view ends at the last paragraph end within T."""

import pytest

import build

HEADER = "The Project Gutenberg eBook of A Book\n\nThis eBook is for the use of anyone.\n\n"
BODY = "Chapter 1\n\nIt was a dark night.\nThe rain fell.\n\n   \n\nA second paragraph.\n\n\n\nThe end."
LICENCE = "\n\nSTART: FULL LICENSE\nTHE FULL PROJECT GUTENBERG LICENSE\nPlease read this.\n"


@pytest.mark.parametrize(
    "start_marker",
    [
        "*** START OF THE PROJECT GUTENBERG EBOOK A BOOK ***",
        "*** START OF THIS PROJECT GUTENBERG EBOOK A BOOK ***",
        "***START OF THE PROJECT GUTENBERG E-BOOK A BOOK***",
        "*** start of the project gutenberg ebook a book ***",
        "*** START OF THE PROJECT GUTENBERG EBOOK A VERY LONG\nTITLE OVER TWO LINES ***",
    ],
)
@pytest.mark.parametrize(
    "end_marker",
    [
        "*** END OF THE PROJECT GUTENBERG EBOOK A BOOK ***",
        "*** END OF THIS PROJECT GUTENBERG EBOOK A BOOK ***",
        "End of the Project Gutenberg EBook of A Book",
        "End of Project Gutenberg's A Book, by Someone",
    ],
)
def test_every_marker_spelling_is_removed(start_marker, end_marker):
    text = HEADER + start_marker + "\n\n\n" + BODY + "\n\n\n" + end_marker + LICENCE
    start, end = build.book_body(text)
    assert text[start:end] == BODY


def test_a_book_without_markers_is_its_whole_trimmed_text():
    text = "\n\u3000\n" + BODY + "\n\n"
    start, end = build.book_body(text)
    assert text[start:end] == BODY


def test_the_legacy_footer_counts_only_at_a_line_start():
    text = (
        BODY
        + "\nHe said: End of the Project Gutenberg story.\n\nMore text.\n\nEnd of the Project Gutenberg EBook of X\n"
    )
    start, end = build.book_body(text)
    assert text[start:end].endswith("More text.")


def test_paragraph_ends_are_first_newlines_of_blank_runs_not_space_lines():
    text = "One.\nStill one.\n   \nStill one.\n\nTwo.\n\n\n\nThree."
    start, end = build.book_body(text)
    ends = [m.start() for m in build.PARAGRAPH_END.finditer(text, start + 1, end)]
    assert [text[:p].rsplit("\n", 1)[-1] for p in ends] == ["Still one.", "Two."]


def book_candidate(text, lang):
    return build.Candidate("r@c", group=lang, book=build.read_book(text, lang))


def plain_view(tok, b, T):
    """The definition, by brute force: the last paragraph end whose whole prompt is within T."""
    prefix = build.BOOK_INSTRUCTION[b.lang] + "\n\n"
    best = None
    for e in b.ends:
        content = prefix + b.text[b.start : e]
        n = tok.plain(content)
        if n > T:
            break
        best = (content, n, e)
    return best


def check_view(tok, c, T):
    got = build.book_view(c, T, tok)
    want = plain_view(tok, c.book, T)
    if want is None:
        assert got is None
        return
    (message,) = got.messages
    assert (message["content"], got.tokens) == want[:2]
    assert got.suffix == f"#{c.book.start}-{want[2]}"


@pytest.mark.parametrize("T", [30, 200, 1_000, 5_000])
def test_book_view_matches_brute_force(mini, T):
    tok = build.Tokens(mini.tokenizer, jobs=2)
    paragraphs = [
        f"Paragraph {i}: " + "word " * (i % 17) + "end.\n\u3000\u3000續。" for i in range(400)
    ]
    text = HEADER + "*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\n" + "\n\n".join(paragraphs)
    check_view(tok, book_candidate(text, "en"), T)


def test_book_view_on_real_books_matches_brute_force_near_T(qwen_tokenizer, realdata):
    # Brute force over every paragraph is slow on whole books; check the chosen end against the
    # definition directly: its prompt is within T and the next paragraph end's prompt is not.
    tok = build.Tokens(qwen_tokenizer, jobs=2)
    for name, lang in (("1228.txt", "en"), ("24264-0.txt", "zh"), ("23863-0.txt", "zh")):
        text = (realdata / "books" / name).read_bytes().decode("utf-8").replace("\r\n", "\n")
        c = book_candidate(text, lang)
        b, prefix = c.book, build.BOOK_INSTRUCTION[lang] + "\n\n"
        for T in (2_048, 16_384, 131_072):
            got = build.book_view(c, T, tok)
            if got is None:  # even the first paragraph is longer than T
                assert tok.plain(prefix + text[b.start : b.ends[0]]) > T
                continue
            (message,) = got.messages
            assert tok.plain(message["content"]) == got.tokens <= T
            i = b.ends.index(int(got.suffix.rsplit("-", 1)[1]))
            assert tok.plain(prefix + text[b.start : b.ends[i + 1]]) > T
            assert "project gutenberg" not in message["content"].lower()
