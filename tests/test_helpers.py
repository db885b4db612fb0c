"""The skip policy of helpers.py: a test this machine cannot run skips, except under TFSHARD_CI=1, where it fails."""

import pytest
from helpers import require, skip_unless_ci

# Both outcomes are caught, so a policy that skips where it should fail shows as a failure here, not as a skip.
OUTCOMES = (pytest.skip.Exception, pytest.fail.Exception)


def _set_ci(monkeypatch, value) -> None:
    if value is None:
        monkeypatch.delenv("TFSHARD_CI", raising=False)
    else:
        monkeypatch.setenv("TFSHARD_CI", value)


@pytest.mark.parametrize("value", [None, "", "0", "true"], ids=["unset", "empty", "zero", "true"])
def test_outside_ci_a_missing_feature_skips_with_its_reason(monkeypatch, value):
    _set_ci(monkeypatch, value)
    for call in (lambda: require(False, "no unshare(1) here"), lambda: skip_unless_ci("no unshare(1) here")):
        with pytest.raises(OUTCOMES) as caught:
            call()
        assert caught.type is pytest.skip.Exception and caught.value.msg == "no unshare(1) here"


def test_under_ci_a_missing_feature_fails_naming_the_policy(monkeypatch):
    _set_ci(monkeypatch, "1")
    for call in (lambda: require(False, "no unshare(1) here"), lambda: skip_unless_ci("no unshare(1) here")):
        with pytest.raises(OUTCOMES) as caught:
            call()
        assert caught.type is pytest.fail.Exception
        assert caught.value.msg == "no unshare(1) here (CI must run this test: TFSHARD_CI=1)"


@pytest.mark.parametrize("value", [None, "1"], ids=["unset", "ci"])
def test_a_feature_that_is_there_neither_skips_nor_fails(monkeypatch, value):
    _set_ci(monkeypatch, value)
    assert require(True, "never said") is None


def test_the_golden_converted_images_are_the_tree_converted_and_a_copy_is_a_separate_out(converted_images,
                                                                                          converted_images_copy):
    """conftest.py's ``converted_images`` holds every image of the tree, and ``converted_images_copy`` is the same
    OUT in another folder: changing the copy leaves the shared one as it was."""
    from helpers import files_under, read_manifest

    assert read_manifest(converted_images.out)["splits"]["train"]["records"] == len(converted_images.written) == 12
    assert converted_images_copy.out != converted_images.out
    assert converted_images_copy.src == converted_images.src
    golden = files_under(converted_images.out)
    assert files_under(converted_images_copy.out) == golden
    with open(f"{converted_images_copy.out}/dataset.json", "ab") as f:
        f.write(b" ")
    assert files_under(converted_images.out) == golden
