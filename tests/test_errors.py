"""hookviz.errors: what a one-line error quotes of another library's reason."""

from __future__ import annotations

from hookviz.errors import first_line


def test_first_line_is_cut_at_a_word_s_end_and_says_so() -> None:
    reason = OSError(
        "Can't load image processor for 'bad/llava_noproc'. If you were trying to load it from "
        "'https://huggingface.co/models', make sure you don't have a local directory with the same name. "
        "Otherwise, make sure 'bad/llava_noproc' is the correct path\nsecond line"
    )
    said = first_line(reason)
    assert len(said) <= 200 and said.endswith("the same name. Otherwise...")
    assert first_line(reason, limit=40) == "Can't load image processor for..."
    assert first_line(ValueError("short\nmore")) == "short"
    assert first_line(KeyError()) == "KeyError"
    assert first_line(ValueError("x" * 300), limit=20) == "x" * 17 + "..."
