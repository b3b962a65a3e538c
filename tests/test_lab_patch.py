"""POST /api/patch: the lab's activation-patching view over the seeded untrained model."""

from __future__ import annotations

import pytest

from glassformer.errors import UsageError
from glassformer.lab.api import LabAPI, untrained_model


@pytest.fixture(scope="module")
def api() -> LabAPI:
    return LabAPI(untrained_model())


@pytest.mark.slow
def test_default_patch_is_the_lesson_sentence(api):
    out = api.patch({})
    cfg = out["model"]["config"]
    assert out["clean_units"] == ["我", "昨天", "给", "了", "他", "一", "本", "书", "。"]
    assert out["row_sees"] == ["<s>", "I", "gave"] and out["predict"] == "him"
    run = out["runs"][0]
    assert run["units"][4] == "她"
    assert len(run["heads"]) == cfg["decoder_layers"] and all(len(r) == cfg["heads"] for r in run["heads"])
    assert abs(run["all_heads"]["fraction"] - 1.0) < 1e-4 and run["nothing"]["fraction"] == 0.0
    embedding = [c["fraction"] for c in run["positions"][0]]
    assert abs(embedding[4] - 1.0) < 1e-4 and max(abs(f) for j, f in enumerate(embedding) if j != 4) < 1e-4


def test_heads_only_takes_sentences_of_other_lengths(api):
    out = api.patch({"corrupt": ["我／给／了／她／一／本／书／。"], "positions": False})
    assert out["runs"][0]["positions"] is None and len(out["runs"][0]["heads"]) > 0


@pytest.mark.parametrize("body, field, words", [
    ({"corrupt": "我／昨天／给／了／龘／一／本／书／。"}, "corrupt", "unknown unit"),
    ({"corrupt": ["我／给／了／她／一／本／书／。"]}, "corrupt", "same count"),
    ({"predict": "zebra"}, "predict", "not a word"),
    ({"positions": "yes"}, "positions", "true/false"),
    ({"corrupt": 3}, "corrupt", "expected a list"),
    ({"corrupt": ["我／昨天／给／了／她／一／本／书／。"] * 5}, "corrupt", "at most 4"),
    ({"clean": ""}, "clean", "non-empty"),
    ({"layer": 1}, "layer", "unknown key"),
    ({"method": "gradient"}, "method", "activation"),
])
def test_bad_bodies_are_400_naming_the_field(api, body, field, words):
    with pytest.raises(UsageError) as caught:
        api.patch(body)
    assert caught.value.status == 400 and caught.value.field.split("[")[0] == field and words in str(caught.value)


def test_null_sentences_mean_the_lesson_defaults_and_bad_lists_are_refused(api):
    """clean / corrupt given as null are the lesson's pair (a null once reached a length check: TypeError)."""
    want = api.patch({})
    assert api.patch({"clean": None, "corrupt": None})["heads"] == want["heads"]
    for body, field in (({"corrupt": []}, "corrupt"), ({"corrupt": [None]}, "corrupt[0]"),
                        ({"corrupt": ["我"] * 500}, "corrupt")):
        with pytest.raises(UsageError, match=field.replace("[", r"\[")) as error:
            api.patch(body)
        assert error.value.status == 400


def test_attribution_method_estimates_the_same_scan_layout(api):
    """method "attribution": one backward pass instead of a forward pass per cell; the same shape of answer, the
    same p_clean / p_corrupt, zero at the embedding positions the two sentences share."""
    exact, approx = api.patch({}), api.patch({"method": "attribution"})
    assert exact["method"] == "activation" and approx["method"] == "attribution"
    a, b = exact["runs"][0], approx["runs"][0]
    assert abs(a["p_clean"] - b["p_clean"]) < 1e-6 and abs(a["p_corrupt"] - b["p_corrupt"]) < 1e-6
    assert [len(r) for r in a["heads"]] == [len(r) for r in b["heads"]]
    assert [len(r) for r in a["positions"]] == [len(r) for r in b["positions"]]
    embedding = [c["fraction"] for c in b["positions"][0]]
    assert all(f == 0.0 for j, f in enumerate(embedding) if j != 4) and embedding[4] != 0.0
