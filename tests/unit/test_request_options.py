"""Request options: a non-finite number is named as such, not as out of range."""

from __future__ import annotations

import pytest

from facefuse.errors import InvalidArgumentError
from facefuse.serving.http.inputs import RequestFields, validate_params
from facefuse.serving.routes.schemas import FuseParams


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity"])
def test_non_finite_form_values_are_called_non_finite(value: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        validate_params(FuseParams, {"degree": value, "min_face_size": value})
    assert info.value.message == ("degree: Input should be a finite number; "
                                  "min_face_size: Input should be a finite number")


def test_non_finite_json_value_is_called_non_finite() -> None:
    fields = RequestFields({"shape": float("nan")})  # json.loads accepts a bare NaN
    fields.typed = True
    with pytest.raises(InvalidArgumentError, match=r"^shape: Input should be a finite number$"):
        validate_params(FuseParams, fields)


def test_out_of_range_is_still_reported_as_a_bound() -> None:
    with pytest.raises(InvalidArgumentError, match="less than or equal to 100"):
        validate_params(FuseParams, {"degree": "100.5"})
