"""What the Hub (or the network) answered, as one line a user can act on.

huggingface_hub raises its own exception per answer (``GatedRepoError``,
``RepositoryNotFoundError``, ``RevisionNotFoundError``...); :func:`hub_error` turns each
into a :class:`~glowlm.errors.ModelLoadError` naming the repo and what to set (the token
for a gated repo, the id, the revision), and :func:`is_network_error` tells the answers
apart from a Hub that cannot be reached, where a cached model is used instead.
"""

from __future__ import annotations

from glowlm.errors import ModelLoadError


def token_hint(token: str | bool | None) -> str:
    return (
        "the token given (--hf-token / HF_TOKEN)"
        if token not in (None, False, True)
        else "the token in HF_TOKEN (or --hf-token, or `hf auth login`)"
    )


def hub_error(
    exc: BaseException, repo_id: str, revision: str | None, endpoint: str, token: str | bool | None
) -> ModelLoadError | None:
    """One line for what the Hub answered; None for errors that are not the Hub's answer."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if type(exc).__name__ == "LocalTokenNotFoundError":
        return ModelLoadError(
            "--hf-token without a value uses the token `hf auth login` saved, and there is "
            "none: pass --hf-token TOKEN or set HF_TOKEN"
        )
    status = getattr(getattr(exc, "response", None), "status_code", None)
    where = "" if endpoint == "https://huggingface.co" else f" at {endpoint} (HF_ENDPOINT)"
    if isinstance(exc, GatedRepoError) or (
        isinstance(exc, HfHubHTTPError)
        and status in (401, 403)
        and not isinstance(exc, RepositoryNotFoundError)
    ):
        if status == 403:
            return ModelLoadError(
                f"model {repo_id} is gated and {token_hint(token)} has no access to it "
                f"(HTTP 403{where}): request access on its Hub page, or set HF_TOKEN / "
                "--hf-token to a token of an account that has it"
            )
        return ModelLoadError(
            f"model {repo_id} is gated: the Hub{where} refused it without a token (HTTP "
            f"{status or 401}); accept its terms on its Hub page, then set HF_TOKEN (or pass "
            "--hf-token TOKEN, hf_token= in LLM)"
        )
    if isinstance(exc, RevisionNotFoundError):
        return ModelLoadError(
            f"model {repo_id} has no revision {revision!r} on the Hub{where} "
            "(--revision takes a branch, tag or commit)"
        )
    if isinstance(exc, RepositoryNotFoundError):
        private = (
            " or is private: set HF_TOKEN (or --hf-token) to a token that can read it"
            if status == 401
            else ""
        )
        return ModelLoadError(
            f"model {repo_id} is not a local path and does not exist on the "
            f"Hub{where} (HTTP {status or 404}){private}; check the id"
        )
    if isinstance(exc, RemoteEntryNotFoundError):
        return ModelLoadError(
            f"model {repo_id}: a file listed by the Hub{where} is missing "
            f"from it (HTTP 404: {exc.__class__.__name__}); try another "
            "revision"
        )
    if isinstance(exc, HfHubHTTPError):
        return ModelLoadError(
            f"model {repo_id}: the Hub{where} answered HTTP {status} ({str(exc).splitlines()[0]})"
        )
    return None


def is_network_error(exc: BaseException) -> bool:
    """Cannot reach the Hub (no route, DNS, timeout, dropped connection, offline mode)."""
    import httpx2
    from huggingface_hub.errors import OfflineModeIsEnabled, RevisionResolutionError

    return isinstance(
        exc,
        httpx2.TransportError
        | OfflineModeIsEnabled
        | RevisionResolutionError
        | ConnectionError
        | TimeoutError,
    )
