"""The ``http`` engine: an inference server under test, over llama.cpp's native ``/completion``
or the OpenAI-compatible ``/v1/completions`` (vLLM, SGLang, ...), optionally started by spectest.

Owns the request of one row, the parsing and checking of its reply (``engines.replies``),
bounded concurrency, retries, and the checks that the server honours seeds and, where it echoes
its settings, dropped no parameter. Knows nothing about process management (``engines.server``)
or statistics. Seeds, loopback, replies and timeouts:
docs/engines.md "The http engine: seeds, loopback, replies, timeouts".
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from spectest.engines import http_exchange, replies, server_probs, server_raw_law
from spectest.engines.base import (
    PLACEHOLDER_TOKEN_ID,
    ArmJob,
    ArmOutput,
    options_dict,
    rounds_from_tuples,
)
from spectest.engines.command import (
    SAMPLER_ORDER,
    EngineProcessError,
    ForeignEngine,
    parse_argv,
    parse_env,
)
from spectest.engines.http_exchange import Cancelled, Inflight, TooLong, exchange
from spectest.errors import ConfigError, EngineError

APIS = ("llamacpp", "openai")
SPECTEST_ORDER = SAMPLER_ORDER  # spectest's pipeline order (engines.command)
LLAMACPP_SAMPLERS = ("temperature", "top_k", "top_p", "min_p", "typ_p", "xtc", "dry")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
SEED_MOD = 2**31


@dataclass(frozen=True)
class _Reply:
    tokens: list[int]
    drafted: int | None
    accepted: int | None
    reported: list[Any] | None = None  # one (p, cdf_lo, list mass) per token (server_probs)


class HTTPEngine(ForeignEngine):
    """An arm run by an HTTP inference server; its options:
    docs/real-engines.md "The `http` engine and engine-managed servers"."""

    name = "http"

    @dataclass(frozen=True)
    class Options:
        api: str = "llamacpp"
        url: str = ""
        server: tuple[str, ...] = ()
        env: tuple[tuple[str, str], ...] = ()
        ready_path: str = "/health"
        model: str = ""
        samplers: tuple[str, ...] = SPECTEST_ORDER
        concurrency: int = 4
        timeout_s: float = 120.0
        retries: int = 3
        startup_timeout_s: float = 600.0
        check_seeds: bool = True
        extra: str = "{}"  # canonical JSON (options must be hashable)
        allow_remote: bool = False
        # top-n reported probabilities asked for (0: none; hashed only when set)
        probs: int = field(default=0, metadata={"omit_default": True})
        # which law the server reports (raw: derive the processed one, engines.server_raw_law)
        probs_law: str = field(default="processed", metadata={"omit_default": True})
        law_probs: int = field(default=0, metadata={"omit_default": True})

    @classmethod
    def parse_options(cls, raw: Mapping[str, Any], where: str, base_dir: Path | None = None) -> Any:
        cls.check_keys(raw, where)
        kw: dict[str, Any] = {}
        api = raw.get("api", "llamacpp")
        if api not in APIS:
            raise ConfigError(f"{where}.api: expected one of {APIS}, got {api!r}")
        kw["api"] = api
        if "server" in raw:
            kw["server"] = parse_argv(raw["server"], f"{where}.server", base_dir)
        kw["env"] = parse_env(raw.get("env"), f"{where}.env")
        kw["url"], kw["allow_remote"] = _parse_url(raw, where, bool(kw.get("server")))
        samplers = raw.get("samplers", list(SPECTEST_ORDER))
        if (
            not isinstance(samplers, list)
            or not samplers
            or any(s not in LLAMACPP_SAMPLERS for s in samplers)
        ):
            raise ConfigError(
                f"{where}.samplers: expected a list of {LLAMACPP_SAMPLERS}, got {samplers!r}"
            )
        if api != "llamacpp" and tuple(samplers) != SPECTEST_ORDER:
            raise ConfigError(f"{where}.samplers: only llama.cpp's API takes a sampler order")
        kw["samplers"] = tuple(samplers)
        kw.update(_parse_numbers(raw, where))
        server_raw_law.check_option(raw.get("probs_law", "processed"), api, f"{where}.probs_law")
        for key in ("ready_path", "model", "probs_law"):
            if key in raw:
                if not isinstance(raw[key], str):
                    raise ConfigError(f"{where}.{key}: expected a string, got {raw[key]!r}")
                kw[key] = raw[key]
        if "check_seeds" in raw:
            if not isinstance(raw["check_seeds"], bool):
                raise ConfigError(f"{where}.check_seeds: expected true or false")
            kw["check_seeds"] = raw["check_seeds"]
        extra = raw.get("extra", {})
        if isinstance(extra, str):  # the canonical form a stored protocol.yaml holds
            try:
                extra = json.loads(extra)
            except ValueError:
                raise ConfigError(f"{where}.extra: not a JSON object: {extra!r}") from None
        if not isinstance(extra, Mapping):
            raise ConfigError(f"{where}.extra: expected a mapping, got {extra!r}")
        kw["extra"] = json.dumps(dict(extra), sort_keys=True)
        return cls.Options(**kw)

    def __init__(self, options: Any, models: Any) -> None:
        super().__init__(options, models)
        self.server: Any = None
        self.base_url = options.url
        self.resolved: dict[str, str] = {}
        self.server_info: dict[str, Any] = {}
        self.seeds_checked = False
        self.where = f"engine http (api {options.api})"
        self._inflight = Inflight()

    def _ensure_server(self) -> None:
        o = self.options
        if not o.server or (self.server is not None and self.server.alive()):
            return
        from spectest.engines.server import ManagedServer, expand_command, free_port

        argv, resolved = expand_command(o.server, None)  # the fixtures first, then the port
        port = free_port()
        argv, at = expand_command(argv, port)
        self.resolved = {**resolved, **at}
        self.base_url = f"http://127.0.0.1:{port}"
        self.server = ManagedServer(
            argv, dict(o.env), self.base_url + o.ready_path, o.startup_timeout_s, self.where
        )
        self.server.start()
        self.server_info = self._info()

    def _info(self) -> dict[str, Any]:
        """Version and settings the server reports (llama.cpp ``/props``, vLLM ``/version``)."""
        info: dict[str, Any] = {}
        for path in ("/props", "/version"):
            try:
                status, _, raw = exchange("GET", self.base_url + path, None, 5.0)
                body = json.loads(raw) if status == 200 else None
            except (OSError, http.client.HTTPException, ValueError, RecursionError):
                continue
            if isinstance(body, dict):
                keep = ("build_info", "version", "model_path", "total_slots")
                info[path] = {k: _scalar(body[k]) for k in keep if k in body}
        return info

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def provenance(self) -> dict[str, Any]:
        from spectest.engines.server import fixture_provenance

        out: dict[str, Any] = {"name": self.name, "options": options_dict(self.options)}
        if self.server is not None:
            out["command"] = list(self.server.argv)
            out["log"] = str(self.server.log_path)
        out["server_info"] = self.server_info
        out["fixtures"] = fixture_provenance(self.resolved)
        return out

    def request_body(self, prompt: list[int], sp: Any, seed: int, T: int) -> dict[str, Any]:
        """The JSON body of one row (spectest's parameters spelled for the server's API)."""
        o = self.options
        if o.api == "llamacpp":
            body: dict[str, Any] = {
                "prompt": prompt,
                "n_predict": T,
                "seed": seed,
                "temperature": float(sp.temperature),
                "top_k": int(sp.top_k),  # 0 = off in both
                "top_p": float(sp.top_p),
                "min_p": float(sp.min_p),
                "typical_p": 1.0,
                "repeat_penalty": 1.0,
                "presence_penalty": 0.0,
                "frequency_penalty": 0.0,
                "dry_multiplier": 0.0,
                "xtc_probability": 0.0,
                "samplers": list(o.samplers),
                "ignore_eos": True,
                "return_tokens": True,
                "cache_prompt": False,
                "stream": False,
            }
        else:
            body = {
                "prompt": prompt,
                "max_tokens": T,
                "seed": seed,
                "temperature": float(sp.temperature),
                "top_k": int(sp.top_k) if sp.top_k > 0 else -1,  # -1 = off in vLLM
                "top_p": float(sp.top_p),
                "min_p": float(sp.min_p),
                "ignore_eos": True,
                "return_token_ids": True,
                "stream": False,
            }
            if o.model:
                body["model"] = o.model
        if o.probs:
            body.update(server_probs.request_fields(o.api, o.probs))
        body.update(json.loads(o.extra))
        return body

    def _post(self, body: Mapping[str, Any], where: str | None = None) -> Any:
        """POST with a deadline and retries (backoff 0.5 s, 1 s, 2 s ...) on connection errors,
        timeouts and 5xx; the decoded JSON reply. A 4xx is the server refusing a parameter and a
        3xx a redirect (never followed): no retry. Once another request of the job has failed,
        no new attempt starts (``Inflight``)."""
        o = self.options
        where = where or self.where
        path = "/completion" if o.api == "llamacpp" else "/v1/completions"
        url = self.base_url + path
        data = json.dumps(body).encode()
        last = ""
        for attempt in range(o.retries + 1):
            if attempt and self._inflight.wait_cancelled(0.5 * 2 ** (attempt - 1)):
                raise Cancelled()
            if self._inflight.cancelled:
                raise Cancelled()
            if self.server is not None and not self.server.alive():
                raise self.server.failure("died while serving requests")
            try:
                status, location, raw = exchange("POST", url, data, o.timeout_s, self._inflight)
            except Cancelled:
                raise
            except TooLong:
                raise replies.ReplyError(
                    f"{where}: the reply of {url} is longer than "
                    f"{http_exchange.MAX_REPLY_BYTES} bytes"
                ) from None
            except (OSError, http.client.HTTPException) as err:
                # a server dying mid-reply raises IncompleteRead / RemoteDisconnected; a server
                # that answers too slowly TimeoutError (socket.timeout)
                if self._inflight.cancelled:
                    raise Cancelled() from None
                last = f"{type(err).__name__}: {err}"
                continue
            if 300 <= status < 400:
                raise EngineError(
                    f"{where}: {url} answered HTTP {status}, a redirect to "
                    f"{replies.short(location, 200)}: spectest does not follow redirects (the "
                    "url, checked against the loopback allow-list, must be the final address)"
                )
            if 400 <= status < 500:
                raise EngineError(
                    f"{where}: {url} refused the request (HTTP {status}): "
                    f"{raw[:300].decode(errors='replace')}"
                )
            if status != 200:
                last = f"HTTP {status}: {raw[:300].decode(errors='replace')}"
                continue
            try:
                return json.loads(raw)
            except (ValueError, RecursionError):  # not JSON, not UTF-8, an int of > 4300 digits
                raise replies.ReplyError(
                    f"{where}: the reply of {url} is not JSON: {replies.short(raw)}"
                ) from None
        msg = f"{where}: {url} failed {o.retries + 1} times; last: {last}"
        if self.server is not None:
            raise self.server.failure(f"did not answer ({msg})")
        raise EngineProcessError(msg)

    def parse_reply(
        self, reply: Any, body: Mapping[str, Any], T: int, where: str | None = None
    ) -> _Reply:
        """Token ids and acceptance telemetry, the reply checked field by field against its
        schema (``engines.replies``); echoed settings compared with what was sent."""
        where = where or self.where
        V = self._vocab_size()
        llama = self.options.api == "llamacpp"
        schema = replies.llamacpp_reply(T, V) if llama else replies.openai_reply(T, V)
        try:
            replies.check(schema, reply)
        except replies.Violation as v:
            hint = ""
            if v.path == "tokens" and v.value is replies.MISSING:
                hint = " (return_tokens dropped?)"
            elif v.path.startswith("choices") and v.path.endswith("token_ids"):
                hint = " (the server ignored return_token_ids?)"
            raise replies.ReplyError(f"{where}: {v}{hint}") from None
        if llama:
            toks = reply["tokens"]
            self._check_echo(reply.get("generation_settings"), body, where)
            timings = reply.get("timings") or {}
            drafted = timings.get("draft_n")
            accepted = timings.get("draft_n_accepted")
        else:
            toks = reply["choices"][0]["token_ids"]
            drafted = accepted = None
        reported = None
        if self.options.probs:
            try:
                reported = server_probs.reported_of(
                    self.options.api, reply, toks, self.options.probs, self._derive(body)
                )
            except replies.Violation as v:
                raise replies.ReplyError(f"{where}: {v} (the reported probabilities)") from None
        return _Reply(list(toks), drafted, accepted, reported)

    def _derive(self, body: Mapping[str, Any]) -> server_probs.Derive | None:
        o = self.options
        return server_raw_law.derive(o.probs_law, body, self._vocab_size() or 0, o.probs)

    def _check_echo(self, settings: Any, body: Mapping[str, Any], where: str) -> None:
        """llama.cpp echoes the settings it used: any difference is a dropped parameter (the
        echo's types are checked by the reply schema first)."""
        if not isinstance(settings, Mapping):
            return
        for key in ("temperature", "top_k", "top_p", "min_p", "seed", "samplers", "ignore_eos"):
            if key not in settings or key not in body:
                continue
            used, sent = settings[key], body[key]
            same = (
                abs(float(used) - float(sent)) <= 1e-6 * max(1.0, abs(float(sent)))
                if isinstance(sent, float)
                else list(used) == list(sent)
                if isinstance(sent, list)
                else used == sent and type(used) is type(sent)
            )
            if not same:
                raise EngineError(
                    f"{where}: the server silently changed {key!r}: sent {sent!r}, it used "
                    f"{replies.short(used)}"
                )

    def _one(self, prompt: list[int], sp: Any, seed: int, T: int, where: str) -> _Reply:
        body = self.request_body(prompt, sp, seed, T)
        return self.parse_reply(self._post(body, where), body, T, where)

    def _where(self, job: ArmJob, i: int, what: str | None = None) -> str:
        return replies.where(
            "http",
            api=self.options.api,
            arm=job.arm,
            prompt=job.prompt_id,
            row=i,
            seed=job.rows[i].seed,
            check=what,
        )

    def _check_seeds(self, job: ArmJob, prompt: list[int], seed: int, T: int) -> None:
        """Two identical requests must give the same tokens, or seeds mean nothing here."""
        where = self._where(job, 0, "of seeds")
        sp = job.rows[0].params
        a = self._one(prompt, sp, seed, T, where)
        b = self._one(prompt, sp, seed, T, where)
        if a.tokens != b.tokens:
            raise EngineError(
                f"{where}: the server does not honour seeds: two identical requests "
                f"(seed {seed}) gave {a.tokens} and {b.tokens}"
            )

    def generate(self, job: ArmJob) -> ArmOutput:
        from spectest.seeding import row_key

        self._ensure_server()
        self._inflight = Inflight()
        B, T = len(job.rows), job.num_positions
        prompt = list(job.prompt_ids)
        seeds = [
            row_key(job.run_key, job.prompt_id, r.config_id, r.seed) % SEED_MOD for r in job.rows
        ]
        if self.options.check_seeds and not self.seeds_checked:
            self._check_seeds(job, prompt, seeds[0], T)
            self.seeds_checked = True
        tokens = np.full((B, T), PLACEHOLDER_TOKEN_ID, dtype=np.int64)  # [B, T]
        # [B, T, (p, cdf_lo, list mass)]: engine-reported, NaN where not reported
        reported = np.full((B, T, 3), np.nan) if self.options.probs else None
        rounds: list[tuple[int, int, int, int, int, int]] = []
        done = 0
        pool = ThreadPoolExecutor(max_workers=self.options.concurrency)
        try:
            futures = {
                pool.submit(self._one, prompt, r.params, seeds[i], T, self._where(job, i)): i
                for i, r in enumerate(job.rows)
            }
            for fut in as_completed(futures):
                i = futures[fut]
                rep = fut.result()  # the first failure ends the job (the rest are cancelled)
                tokens[i, : len(rep.tokens)] = rep.tokens
                if reported is not None and rep.reported is not None:
                    reported[i, : len(rep.tokens)] = np.array(rep.reported, dtype=np.float64)
                if rep.drafted is not None and rep.accepted is not None:
                    # one readout row per sequence: the server reports totals, not rounds
                    rounds.append((i, 0, 0, int(rep.drafted), int(rep.accepted), len(rep.tokens)))
                done += 1
                job.tick(done)
        except BaseException:
            # fail fast: queued requests never start, requests in flight are cut off
            pool.shutdown(wait=False, cancel_futures=True)
            self._inflight.cancel()
            raise
        finally:
            pool.shutdown(wait=True)
        rounds.sort()
        return ArmOutput(tokens, rounds_from_tuples(rounds), False, None, reported)


def _parse_url(raw: Mapping[str, Any], where: str, has_server: bool) -> tuple[str, bool]:
    """``(url without a trailing slash, allow_remote)``: exactly one of a url or a server, and a
    url's host a loopback address unless ``allow_remote``."""
    url = raw.get("url", "")
    if not isinstance(url, str):
        raise ConfigError(f"{where}.url: expected a string, got {url!r}")
    if bool(url) == has_server:
        raise ConfigError(f"{where}: give exactly one of url (a running server) or server")
    allow_remote = raw.get("allow_remote", False)
    if not isinstance(allow_remote, bool):
        raise ConfigError(f"{where}.allow_remote: expected true or false, got {allow_remote!r}")
    if url:
        host = urlparse(url).hostname
        if urlparse(url).scheme not in ("http", "https") or not host:
            raise ConfigError(f"{where}.url: expected http://HOST:PORT, got {url!r}")
        if host not in LOOPBACK and not allow_remote:
            raise ConfigError(
                f"{where}.url: {host!r} is not a loopback address (allow_remote: true to "
                "test a remote server)"
            )
    return url.rstrip("/"), allow_remote


def _parse_numbers(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The numeric options present in ``raw``, each checked against its type and lower bound."""
    kw: dict[str, Any] = {}
    for key, typ, lo in (
        ("concurrency", int, 1),
        ("retries", int, 0),
        ("probs", int, 0),
        ("law_probs", int, 0),
        ("timeout_s", float, 0.001),
        ("startup_timeout_s", float, 0.001),
    ):
        if key in raw:
            v = raw[key]
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v >= lo
            if not ok or (typ is int and not isinstance(v, int)):
                raise ConfigError(f"{where}.{key}: expected a {typ.__name__} >= {lo}, got {v!r}")
            kw[key] = typ(v)
    return kw


def _scalar(value: Any) -> Any:
    """A server-reported value as provenance keeps it: short strings and numbers as they are,
    anything else as a cut ``repr``."""
    if isinstance(value, str):
        return value[:200]
    if isinstance(value, (bool, float)) or (isinstance(value, int) and abs(value) < 2**63):
        return value
    return replies.short(value, 200)
