"""docs/failures.md quotes what build.py and score.py print (tests/messages.py reads both).

Two directions: every error line the table quotes is one the code can print, in those words; and
every message the code raises has a row quoting it. A message added without its row fails the
second test, which names the template and where it is raised; add the row (an example with real
values, what to do, the test that provokes it) in the section of the command that prints it.
"""

from messages import STAR, WORD, examples, matches, templates

# Quoted lines whose words are another program's, passed on whole by a template that is all
# values ("{who}: {e}"): Python's own TypeError for an option a constructor does not take.
OTHERS = ("got an unexpected keyword argument",)

# Messages that have no row yet. This list only shrinks: a message listed here that gets its row,
# or is no longer raised, fails the test until it is taken off.
AWAITING = set()


def shown(text):
    return text.replace(STAR, "…").replace(WORD, "…")


def test_every_quoted_error_is_one_the_code_prints():
    code = templates(returned=True)
    wrong = [f"docs/failures.md:{e.line}: {shown(e.text)}"
             for e in examples() if e.section in ("build.py", "score.py")
             and not any(w in e.text for w in OTHERS)
             and not any(matches(t, e) for t in code)]  # fmt: skip
    assert not wrong, "quoted in docs/failures.md, printed by no code:\n" + "\n".join(wrong)


def test_every_message_has_its_row():
    quoted = [e for e in examples() if e.section in ("build.py", "score.py")]
    missing = {str(t).partition(": ")[2]: t for t in templates()
               if not any(matches(t, e) for e in quoted)}  # fmt: skip
    new = [str(t) for text, t in missing.items() if text not in AWAITING]
    assert not new, "messages without a row in docs/failures.md:\n" + "\n".join(new)
    assert not AWAITING - set(missing), (
        f"rows now written, take them off AWAITING: {AWAITING - set(missing)}"
    )
