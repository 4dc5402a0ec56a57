"""Every codec implements the abstract base with the base's own signatures."""

from __future__ import annotations

import inspect

import pytest

from tpload.codecs import base
from tpload.codecs.base import Codec
from tpload.codecs.registry import for_role, roles


def test_the_base_is_abstract_and_re_exported() -> None:
    assert Codec is base.Codec
    assert Codec.__abstractmethods__ == {"fit", "cuts", "decode", "reference"}
    with pytest.raises(TypeError, match="abstract"):
        Codec()  # type: ignore[abstract]
    assert "stacked" in inspect.signature(Codec.fit).parameters


@pytest.mark.parametrize("role", roles())
def test_each_codec_implements_every_abstract_method_with_the_bases_signature(role: str) -> None:
    codec = for_role(role)
    cls = type(codec)
    assert not cls.__abstractmethods__
    for name in sorted(Codec.__abstractmethods__):
        assert getattr(cls, name) is not getattr(Codec, name), f"{cls.__name__}.{name}"
    overridden = [
        name
        for name, member in vars(Codec).items()
        if inspect.isfunction(member) and name in vars(cls)
    ]
    for name in overridden:
        mine, theirs = (
            inspect.signature(getattr(cls, name)),
            inspect.signature(getattr(Codec, name)),
        )
        assert mine == theirs, f"{cls.__name__}.{name}{mine} is not Codec.{name}{theirs}"
