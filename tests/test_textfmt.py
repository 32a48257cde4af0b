from harness.textfmt import collapse_runs


def test_collapse_runs():
    assert collapse_runs([1, 2, 3, 7]) == "1-3, 7"
    assert collapse_runs([4]) == "4"
    assert collapse_runs([1, 3, 4, 5, 9, 10], dash="..", sep=",") == "1,3..5,9..10"
