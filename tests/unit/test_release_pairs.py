"""rules/context/release_pairs.yaml: which torch extension release was built for which torch,
validated when loaded (one line per problem), and looked up by the installed torch's
public release (a +cpu or +cuXXX build pairs as its release does)."""
from __future__ import annotations

import pytest

from seedance.collect import package_context
from seedance.model.errors import RuleError


def test_the_shipped_pairs_are_valid_and_each_names_its_source():
    pairs = package_context.release_pairs()
    assert {"torchvision", "torchaudio"} <= set(pairs)
    assert all(source.startswith("https://") for table in pairs.values() for _release, source in table.values())


def test_a_local_build_pairs_as_its_public_release():
    assert package_context.matching_release("torchvision", "2.4.1+cu124")[0] == "0.19.1"
    assert package_context.matching_release("TorchVision", "2.4.1")[0] == "0.19.1"
    assert package_context.matching_release("torchaudio", "2.0.1+cpu")[0] == "2.0.2"  # not the same number
    assert package_context.matching_release("torchvision", "1.99.0") is None
    assert package_context.matching_release("xformers-unknown", "2.4.1") is None
    assert "download.pytorch.org/whl/cu124" in package_context.index_caveat("2.4.1+cu124")
    assert package_context.index_caveat("2.4.1") == ""


def _doc(pair=None, **entry):
    item = {"distribution": "torchvision", "pairs": [pair if pair is not None else
                                                     {"torch": "2.4.1", "release": "0.19.1", "source": "s"}]}
    item.update(entry)
    return {"extensions": [item]}


@pytest.mark.parametrize("doc,says", [
    ({"ext": []}, "expected a mapping with an 'extensions:' list"),
    (_doc(colour=1), "unknown field(s) colour"),
    (_doc(distribution="torchvision==0.19"), "is not a plain project name"),
    (_doc(pairs=[]), "'pairs' must be a non-empty list"),
    (_doc({"torch": "2.4.1+cpu", "release": "0.19.1", "source": "s"}), "is not a release like 2.4.1"),
    (_doc({"torch": "2.4.1", "release": "0.19.1"}), "'source' must be a non-empty string"),
    ({"extensions": [{"distribution": "torchvision", "pairs": [
        {"torch": "2.4.1", "release": "0.19.1", "source": "s"},
        {"torch": "2.4.1", "release": "0.19.0", "source": "s"}]}]}, "torch 2.4.1 is paired twice"),
])
def test_a_bad_release_pairs_entry_is_one_line(doc, says):
    with pytest.raises(RuleError) as raised:
        package_context.validate_release_pairs(doc, "release_pairs.yaml")
    assert says in str(raised.value) and "\n" not in str(raised.value)
