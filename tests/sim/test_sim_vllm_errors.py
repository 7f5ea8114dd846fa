"""The simulated vLLM's error bodies name their type as vLLM does, whatever reason phrases
the running Python gives the statuses."""

import pytest

from sim.vllm.errors import error_body, error_type


@pytest.mark.parametrize(
    ("status", "name"),
    [
        (400, "BadRequestError"),
        (404, "NotFoundError"),
        (422, "UnprocessableEntityError"),
        (500, "InternalServerError"),
        (501, "NotImplementedError"),
        (503, "ServiceUnavailableError"),
        (429, "TooManyRequestsError"),
    ],
)
def test_a_status_is_named_as_vllm_names_it(status: int, name: str) -> None:
    assert error_type(status) == name
    assert error_body(status, "no")["error"]["type"] == name
