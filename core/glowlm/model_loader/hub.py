"""Download a model from the Hugging Face Hub (or a mirror) into the standard cache.

:func:`fetch_model` runs once per engine, in the process the user started, before
anything else reads the model: it resolves the revision to a commit, asks the Hub for
the repo's file list, downloads only what glowlm reads
(:mod:`~glowlm.model_loader.hub_files`) with ``snapshot_download``, checks the snapshot
is whole, and returns the engine config pinned to that commit (and to the GGUF file a
``:QUANT`` tag picked). The ranks and every later look-up then resolve the same snapshot
from the cache without the network (:mod:`~glowlm.model_loader.resolve`).

Everything on the wire is huggingface_hub's: its resumable downloads (a ``.incomplete``
file continues with an HTTP Range request, within one run and across runs), its cache
layout, ``HF_TOKEN`` or the token ``hf auth login`` saved. glowlm passes the endpoint
(``HF_ENDPOINT``), the cache directory and offline mode (``HF_HUB_OFFLINE`` /
``--offline``) explicitly, read at call time through :func:`glowlm.envs.hub`. Every
failure a user can cause (a gated repo without a token, a wrong id or revision, no
network and no cache) is one :class:`~glowlm.errors.ModelLoadError` line.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from glowlm import envs
from glowlm.config import EngineConfig
from glowlm.errors import ModelLoadError
from glowlm.logger import init_logger
from glowlm.model_loader.hub_errors import hub_error, is_network_error
from glowlm.model_loader.hub_files import FilePlan, index_shards, plan_files, split_spec
from glowlm.model_loader.hub_progress import download_progress
from glowlm.model_loader.resolve import check_snapshot, hf_cache_dir

logger = init_logger(__name__)


def _patterns(files: list[str] | tuple[str, ...]) -> list[str]:
    """Exact file names as fnmatch patterns (``[`` would start a character class)."""
    return [f.replace("[", "[[]") for f in files]


@dataclasses.dataclass(frozen=True)
class Fetched:
    """A model in the cache: its commit, and its GGUF file when the weights are one."""

    repo_id: str
    commit: str
    snapshot: Path
    gguf_file: str | None


def _download(
    repo_id: str,
    revision: Any,
    files: list[str] | tuple[str, ...],
    endpoint: str,
    token: str | bool | None,
) -> Path:
    """``files`` of the commit into the cache: one snapshot_download call (parallel, one
    bar); where the server lists no tree (a mirror that serves only the revision and
    file routes), file by file with hf_hub_download."""
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = str(hf_cache_dir())
    try:
        with download_progress(f"Downloading {repo_id}") as bar:
            path = snapshot_download(
                repo_id,
                revision=revision,
                cache_dir=cache,
                endpoint=endpoint,
                token=token,
                allow_patterns=_patterns(files),
                tqdm_class=bar,
                max_workers=4,
            )
        return Path(path)
    except LocalEntryNotFoundError as exc:
        # The revision answered (fetch resolved it) but the tree listing did not.
        logger.info(
            "%s: no file listing at %s (%s); downloading file by file",
            repo_id,
            endpoint,
            type(exc.__cause__ or exc).__name__,
        )
    local = None
    with download_progress(f"Downloading {repo_id}", per_file=True) as bar:
        for name in files:
            local = hf_hub_download(
                repo_id,
                name,
                revision=revision,
                cache_dir=cache,
                endpoint=endpoint,
                token=token,
                tqdm_class=bar,
            )
    assert local is not None, "a plan names at least one file"
    return Path(local).parents[len(Path(files[-1]).parts) - 1]


def _from_cache(
    repo_id: str, tag: str | None, revision: str | None, gguf_file: str | None
) -> Fetched:
    from glowlm.model_loader.resolve import resolve_model

    spec = repo_id + (f":{tag}" if tag else "")
    source = resolve_model(spec, revision, gguf_file)
    snapshot = source.path if source.gguf_file is None else source.gguf_file.parent
    while snapshot.parent.name != "snapshots" and snapshot.parent != snapshot:
        snapshot = snapshot.parent  # a GGUF file in a subfolder of the repo
    name = (
        source.gguf_file.relative_to(snapshot).as_posix() if source.gguf_file is not None else None
    )
    return Fetched(repo_id, snapshot.name, snapshot, name)


def fetch(
    repo_id: str,
    *,
    tag: str | None = None,
    revision: str | None = None,
    gguf_file: str | None = None,
    token: str | bool | None = None,
    allow_pickle: bool = False,
    offline: bool = False,
) -> Fetched:
    """Make ``repo_id`` (at ``revision``; one GGUF file when ``tag`` or ``gguf_file``
    names it) whole in the cache and say which commit it is. Offline (``offline`` or
    ``HF_HUB_OFFLINE``), the cache only; online, without a network, the cache with a
    warning, as huggingface_hub does."""
    env = envs.hub()
    if offline or env.offline:
        return _from_cache(repo_id, tag, revision, gguf_file)
    from huggingface_hub import HfApi

    api = HfApi(endpoint=env.endpoint, token=token)
    try:
        resolved = api.resolve_revision(
            repo_id, revision=revision or "main", cache_dir=str(hf_cache_dir())
        )
        done = _already_cached(repo_id, resolved.resolved, tag, gguf_file, allow_pickle)
        if done is not None:
            return done  # one request (the revision) when the cache holds the commit
        info = api.model_info(repo_id, revision=resolved.resolved, files_metadata=True)
    except Exception as exc:  # noqa: BLE001 - mapped to one line below
        error = hub_error(exc, repo_id, revision, env.endpoint, token)
        if error is not None:
            raise error from None
        if not is_network_error(exc):
            raise
        try:
            found = _from_cache(repo_id, tag, revision, gguf_file)
        except ModelLoadError:
            raise ModelLoadError(
                f"cannot reach the Hub at {env.endpoint} to download {repo_id} "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}), and "
                f"it is not in the Hugging Face cache ({hf_cache_dir()}); check the network "
                "or HF_ENDPOINT"
            ) from None
        logger.warning(
            "cannot reach the Hub at %s (%s): using %s from the cache (commit %s)",
            env.endpoint,
            type(exc).__name__,
            repo_id,
            found.commit[:12],
        )
        return found
    siblings = list(info.siblings or [])
    plan = plan_files(
        [s.rfilename for s in siblings],
        tag=tag,
        gguf_file=gguf_file,
        allow_pickle=allow_pickle,
        where=repo_id,
    )
    sizes = {s.rfilename: s.size or 0 for s in siblings}
    try:
        files = list(plan.files)
        if plan.index is not None:  # the metadata and index first (kB), then its shards
            snapshot = _download(repo_id, resolved, files, env.endpoint, token)
            files = index_shards(snapshot / plan.index)
        _announce(repo_id, resolved, files, sizes, env.endpoint)
        snapshot = _download(repo_id, resolved, files, env.endpoint, token)
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - mapped to one line below
        error = hub_error(exc, repo_id, revision, env.endpoint, token)
        if error is not None:
            raise error from None
        if not (is_network_error(exc) or isinstance(exc, OSError)):
            raise
        raise ModelLoadError(
            f"the download of {repo_id} from {env.endpoint} did not finish ({type(exc).__name__}"
            f": {str(exc).splitlines()[0] if str(exc) else ''}); start again to fetch the rest, "
            "with the files that finished kept"
        ) from None
    chosen = check_snapshot(repo_id, snapshot, tag, plan.gguf_file)
    name = chosen.relative_to(snapshot).as_posix() if chosen is not None else None
    return Fetched(repo_id, snapshot.name, snapshot, name)


def _already_cached(
    repo_id: str, commit: str, tag: str | None, gguf_file: str | None, allow_pickle: bool
) -> Fetched | None:
    """The commit's model when its snapshot is whole by the tree listing huggingface_hub
    cached when it downloaded it; None when anything is missing or unknown."""
    from huggingface_hub import get_cached_repo_tree

    try:
        names = [
            f.path
            for f in get_cached_repo_tree(repo_id, revision=commit, cache_dir=str(hf_cache_dir()))
        ]
        plan = plan_files(
            names, tag=tag, gguf_file=gguf_file, allow_pickle=allow_pickle, where=repo_id
        )
    except Exception:  # noqa: BLE001 - no cached listing, or one the online path explains
        return None
    if not check_cached(repo_id, commit, plan):
        return None
    from glowlm.model_loader.resolve import cached_snapshot

    snapshot = cached_snapshot(repo_id, commit)
    assert snapshot is not None  # check_cached found it
    return Fetched(repo_id, commit, snapshot, plan.gguf_file)


def _announce(
    repo_id: str, revision: Any, files: list[str], sizes: dict[str, int], endpoint: str
) -> None:
    """One line before the bytes: what is fetched (the files not cached yet), from where,
    into which cache."""
    from glowlm.model_loader.resolve import cached_snapshot

    snapshot = cached_snapshot(repo_id, revision.resolved)
    todo = [f for f in files if snapshot is None or not (snapshot / f).is_file()]
    if not todo:
        return
    what = todo[0] if len(todo) == 1 else f"{len(todo)} files"
    logger.info(
        "downloading %s (revision %s, commit %s) from %s: %s, %.1f MB, into %s",
        repo_id,
        revision,
        revision.resolved[:12],
        endpoint,
        what,
        sum(sizes.get(f, 0) for f in todo) / 1e6,
        hf_cache_dir(),
    )


def check_cached(repo_id: str, commit: str, plan: FilePlan) -> bool:
    """Whether the plan's files are all in the cached snapshot of ``commit`` already."""
    from glowlm.model_loader.hub_files import missing_files
    from glowlm.model_loader.resolve import cached_snapshot

    snapshot = cached_snapshot(repo_id, commit)
    try:
        return snapshot is not None and not missing_files(snapshot, plan)
    except ModelLoadError:
        return False


def fetch_model(config: EngineConfig) -> EngineConfig:
    """``config`` with a Hub model downloaded and pinned: ``revision`` the commit in the
    cache, ``gguf_file`` the file a ``:QUANT`` tag picked. Local paths and the default
    model pass through unchanged."""
    spec = split_spec(config.model) if config.model else None
    if spec is None or Path(config.model).expanduser().exists():
        return config
    repo_id, tag = spec
    got = fetch(
        repo_id,
        tag=tag,
        revision=config.revision,
        gguf_file=config.gguf_file,
        token=config.hf_token,
        allow_pickle=config.allow_pickle,
        offline=config.offline,
    )
    logger.info(
        "model %s: revision %s = commit %s%s, in %s",
        config.model,
        config.revision or "main",
        got.commit[:12],
        f", GGUF file {got.gguf_file}" if got.gguf_file else "",
        got.snapshot,
    )
    return dataclasses.replace(config, revision=got.commit, gguf_file=got.gguf_file)
