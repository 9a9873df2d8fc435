from streamcheck.core.compare import compare_tokens, format_comparison, side_by_side


def decode(tokens):
    return bytes(tokens).decode("latin-1")


def test_identical_sequences_match():
    c = compare_tokens([1, 2, 3], [1, 2, 3])
    assert c.matches and c.first_divergence is None and c.divergent == 0
    assert "match" in c.summary()


def test_one_step_lag_is_diagnosed():
    ref = list(b"Beautiful is better than ugly.")
    # The symptom of the implicit-join bug: from token 5 on, each output is the previous step's.
    cand = ref[:5] + ref[4:-1]
    c = compare_tokens(ref, cand)
    assert c.first_divergence == 5
    assert c.lag1 == c.divergent > 0
    assert c.lag1_share == 1.0
    assert "100%" in c.summary()


def test_repeated_token_runs_are_counted():
    c = compare_tokens([1, 2, 3, 4, 5], [1, 2, 2, 2, 2])
    assert c.longest_repeat == 4 and c.reference_longest_repeat == 1
    assert c.divergent == 3 and c.lag1 == 1  # only position 2 equals reference[1]


def test_length_mismatch_diverges_at_the_shorter_end():
    c = compare_tokens([1, 2, 3], [1, 2])
    assert not c.matches and c.first_divergence == 2 and c.divergent == 0


def test_side_by_side_aligns_columns_and_marks_the_divergence():
    ref = list(b"abcdefgh")
    cand = list(b"abcddefg")
    text = side_by_side(compare_tokens(ref, cand), decode)
    ref_row, cand_row, marker = text.splitlines()
    assert ref_row == "reference: abcdefgh"
    assert cand_row == "candidate: abcddefg"
    assert marker.index("^") == len("reference: ") + 4 and "token 4" in marker


def test_format_comparison_includes_the_race_report():
    msg = format_comparison(compare_tokens([1, 2], [1, 1]), race_report="RAW race on `Y`")
    assert "first divergence at token 1" in msg and "RAW race on `Y`" in msg
