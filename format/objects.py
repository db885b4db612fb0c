"""Object stores TensorFlow does not know (``s3://``, ``az://``/``abfs://``, ``https://``), read through fsspec.

TensorFlow's file systems open local paths and ``gs://`` (``storage.py`` keeps those on ``tf.io.gfile``); every other
remote scheme goes through the file system fsspec names for it: s3fs for ``s3://``, adlfs for ``az://`` and
``abfs://``, fsspec's own HTTP file system for ``https://`` and ``http://`` (read-only, and it cannot list a folder).
They come with the ``cloud`` extra (``pip install 'tfshard[cloud]'``) and are imported only when a URL needs them.

Credentials are found the way each library finds them: the environment (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``,
``AWS_ENDPOINT_URL`` for an S3-compatible store, ``AZURE_STORAGE_ACCOUNT_NAME``...), the provider's config files
(``~/.aws/credentials``), options given with a dataset's URL (a reader's ``storage_options=``, the CLI's
``--storage-option``: ``use_storage_options``) and options set for the process with ``set_storage_options``
(fsspec's keys: s3fs's ``endpoint_url``, ``key``, ``secret``; adlfs's ``account_name``, ``connection_string``).
Every network wait has a
timeout; a request that fails on a dropped connection, a timeout or a 5xx answer (S3's ``503 SlowDown`` included)
is retried with backoff, a bounded number of times. No message names a secret: every option value and credential
variable that could be one is replaced by ``***`` in the errors raised here.

No TensorFlow here.

Example:
  objects.set_storage_options("s3", {"endpoint_url": "http://127.0.0.1:9000", "key": "...", "secret": "..."})
  objects.size("s3://bucket/photos-tfr/dataset.json")   # 2144
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

log = logging.getLogger(__name__)

# scheme -> (the module that adds it, fsspec's protocol)
SCHEMES: dict[str, tuple[str, str]] = {
    "s3": ("s3fs", "s3"),
    "az": ("adlfs", "az"),
    "abfs": ("adlfs", "abfs"),
    "https": ("aiohttp", "https"),
    "http": ("aiohttp", "http"),
}
# TensorFlow's own file systems (format/storage.py): gs://, and its local, in-memory and Hadoop ones
NATIVE = ("gs", "file", "ram", "hdfs", "viewfs", "har")
EXTRA = "pip install 'tfshard[cloud]'"
LISTS = ("s3", "az", "abfs")  # an HTTP server gives no listing a program can rely on

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0  # between two reads of one response, not for a whole object
ATTEMPTS = 5
BACKOFF_S = 0.2  # doubled after each failed attempt, up to BACKOFF_MAX_S, with jitter
BACKOFF_MAX_S = 5.0
PART_BYTES = 50 * 2**20  # an S3 upload's parts (s3fs's default): one request below two of them
BLOCK_BYTES = 8 * 2**20  # read-ahead of an open object (s3fs and adlfs default to 50 MiB and 4 MiB)
# botocore's connections per S3 client, as many as the shard cache's fetch threads (readers/shard_cache/ahead.py):
# with botocore's 10, a reader's 18 fetches ahead queued for a connection, and epoch 1 ran at 0.67x a plain
# `s3fs.get` of its shards (0.87-0.95x with 64; benchmarks/network.py --only s3)
S3_CONNECTIONS = 64

SECRET_KEYS = re.compile(r"key|secret|token|password|credential|connection_string|sas|signature|sig$", re.I)
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AZURE_STORAGE_KEY",
              "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_SAS_TOKEN",
              "AZURE_CLIENT_SECRET", "AWS_ACCESS_KEY_ID")

# what _make reads from the environment (botocore and aiohttp read the rest themselves)
_ENVIRONMENT = ("SSL_CERT_FILE", "SSL_CERT_DIR", "AWS_CA_BUNDLE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")
TLS_FIX = ("set SSL_CERT_FILE to the CA bundle that signed the store's certificate (for s3://, AWS_CA_BUNDLE too, "
           "which wins over it)")

_options: dict[str, dict[str, Any]] = {}
# a URL prefix ending in "/" -> the options given with it (use_storage_options): the longest prefix of a URL wins
_scoped: dict[str, dict[str, Any]] = {}
_filesystems: dict[tuple, Any] = {}
_lock = threading.Lock()

T = TypeVar("T")


class UnsupportedSchemeError(ValueError):
    """A URL whose scheme no file system here reads (or whose library is not installed)."""


def scheme_of(path: str) -> str | None:
    """The URL scheme of ``path`` in lower case (``"s3"``), or None for a local path.

    Example:
      scheme_of("s3://bucket/ds"), scheme_of("/data/ds")   # ("s3", None)
    """
    if "://" not in path:
        return None
    return path.split("://", 1)[0].lower()


def uses_fsspec(path: str) -> bool:
    """Whether ``path`` is read through fsspec here (``s3://``, ``az://``, ``abfs://``, ``https://``, ``http://``)."""
    return scheme_of(path) in SCHEMES


def lists(path: str) -> bool:
    """Whether a folder of ``path``'s store can be listed (not over plain HTTP: its folders are only prefixes)."""
    return scheme_of(path) in LISTS


@functools.lru_cache(maxsize=1)
def supported_schemes() -> tuple[str, ...]:
    """The remote schemes that work in this environment: gs:// always, the others with their library installed
    (looked up once per process, without importing it)."""
    import importlib.util

    found = ["gs"]
    for scheme, (module, _) in SCHEMES.items():
        if importlib.util.find_spec(module) is not None and importlib.util.find_spec("fsspec") is not None:
            found.append(scheme)
    return tuple(found)


def check_scheme(path: str) -> None:
    """Raises ``UnsupportedSchemeError`` (one line: the schemes that work, the extra that adds the rest) unless
    ``path``'s scheme is local, gs:// or an fsspec scheme whose library is installed."""
    scheme = scheme_of(path)
    if scheme is None or scheme in NATIVE or scheme in supported_schemes():
        return
    working = ", ".join(f"{s}://" for s in supported_schemes())
    missing = "" if scheme not in SCHEMES else f" ({SCHEMES[scheme][0]} is not installed)"
    raise UnsupportedSchemeError(
        f"{_shown(path)}: tfshard cannot read {scheme}:// URLs here{missing} (got scheme {scheme!r}); the ones that "
        f"work: local paths, {working}; `{EXTRA}` adds s3://, az://, abfs://, https:// and http://")


def set_storage_options(scheme: str, options: Mapping[str, Any] | None) -> None:
    """Options for every file system of ``scheme`` this process opens from now on (fsspec's keys: s3fs's
    ``endpoint_url``, ``key``, ``secret``, ``client_kwargs``; adlfs's ``account_name``, ``connection_string``...);
    None forgets them. They win over the environment and config files, and over this module's timeouts.

    Raises:
      ValueError: a scheme not read through fsspec, or options that are not a dict of string keys.

    Example:
      set_storage_options("s3", {"endpoint_url": "https://minio.internal:9000"})
    """
    scheme = scheme.lower().removesuffix("://")
    if scheme not in SCHEMES:
        raise ValueError(f"set_storage_options: no options for {scheme}:// here (got {scheme!r}); pass one of "
                         f"{sorted(SCHEMES)}")
    if options is not None and (not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options)):
        raise ValueError(f"set_storage_options: options must be a dict of fsspec's keys (got a "
                         f"{type(options).__name__}); pass e.g. {{'endpoint_url': 'https://...'}}")
    with _lock:
        if options is None:
            _options.pop(scheme, None)
        else:
            _options[scheme] = dict(options)
        for key in [k for k in _filesystems if k[0] == scheme]:
            del _filesystems[key]


def storage_options(scheme: str) -> dict[str, Any]:
    """The options ``set_storage_options`` gave ``scheme`` (a copy; {} when none)."""
    with _lock:
        return dict(_options.get(scheme.lower(), {}))


def use_storage_options(urls: str | Sequence[str], options: Mapping[str, Any] | None, what: str = "storage_options"
                        ) -> None:
    """Options for every object under each of ``urls`` (a dataset's folder), from now on in this process: what a
    reader's ``storage_options=`` and the CLI's ``--storage-option`` give. The shard cache's fetch threads, the epoch
    checks and ``verify`` find them by the URL they read; options given for a longer prefix win, then these win
    over ``set_storage_options``' for the scheme, the environment and this module's timeouts. ``config_kwargs`` and
    ``client_kwargs`` are merged into this module's (so ``{"config_kwargs": {"read_timeout": 5}}`` keeps the
    retries). None does nothing; local and ``gs://`` paths in ``urls`` are left alone.

    Raises:
      ValueError: options that are not a dict of string keys, or none of ``urls`` read through fsspec (TensorFlow
        reads local and ``gs://`` paths itself, with no such options).

    Example:
      use_storage_options("s3://bucket/photos-tfr", {"endpoint_url": "http://127.0.0.1:9000"})
    """
    if options is None:
        return
    urls = [urls] if isinstance(urls, str) else list(urls)
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise ValueError(f"{what}: must be a dict of fsspec's keys (got a {type(options).__name__}); pass e.g. "
                         "{'endpoint_url': 'https://...'}")
    remote = [url for url in urls if uses_fsspec(url)]
    if not remote:
        shown = ", ".join(_shown(url) for url in urls) or "no path"
        raise ValueError(f"{shown}: {what} apply to s3://, az://, abfs:// and https:// URLs (got {sorted(options)}); "
                         "drop them: TensorFlow opens local and gs:// paths itself, with its own credentials")
    for url in remote:
        check_scheme(url)
    with _lock:
        for url in remote:
            _scoped[url.rstrip("/") + "/"] = dict(options)


def options_for(url: str) -> dict[str, Any]:
    """The options a file system for ``url`` is made with: its scheme's (``set_storage_options``), then those of the
    longest prefix of ``url`` given to ``use_storage_options`` over them (a copy)."""
    with _lock:
        return _options_for(url)


def _options_for(url: str) -> dict[str, Any]:
    scheme = scheme_of(url) or ""
    found = [p for p in _scoped if url.startswith(p) or url == p[:-1]]
    scoped = _scoped[max(found, key=len)] if found else {}
    return {**_options.get(scheme, {}), **scoped}


def redact(text: str) -> str:
    """``text`` with every secret this process knows (option values under a key such as ``secret``, ``key``,
    ``connection_string``, ``sas_token``; credential variables of the environment; a URL's query) as ``***``."""
    secrets = [os.environ.get(name, "") for name in SECRET_ENV]
    with _lock:
        for options in [*_options.values(), *_scoped.values()]:
            secrets += [str(v) for k, v in _flat(options) if SECRET_KEYS.search(k) and v]
    for secret in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, "***")
    text = re.sub(r"(AccountKey|SharedAccessSignature|SharedAccessKey)=[^;&\s'\"]+", r"\1=***", text)
    return re.sub(r"(\w+://[^\s?'\"]*)\?[^\s'\"]+", r"\1?***", text)


def _flat(options: Mapping, prefix: str = ""):
    for key, value in options.items():
        if isinstance(value, Mapping):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _shown(url: str) -> str:
    """A URL as a message may show it (a query, where a SAS token or signature lives, hidden)."""
    return redact(url)


def filesystem(url: str):
    """The fsspec file system of ``url``'s scheme, made once per process and set of options, with this module's
    timeouts and the options ``url`` is given (``options_for``).

    Raises:
      UnsupportedSchemeError: not an fsspec scheme, or its library is not installed.
    """
    check_scheme(url)
    scheme = scheme_of(url)
    if scheme not in SCHEMES:
        raise UnsupportedSchemeError(f"{_shown(url)}: not a URL of an fsspec store (got {scheme!r}); pass one of "
                                     f"{', '.join(f'{s}://' for s in SCHEMES)}")
    with _lock:
        options = _options_for(url)
        # the environment _make reads, so a bundle or endpoint set later in the process is not missed
        key = (scheme, repr(sorted(_flat(options))), *(os.environ.get(name) for name in _ENVIRONMENT))
        if key not in _filesystems:
            _filesystems[key] = _make(scheme, options)
        return _filesystems[key]


def _make(scheme: str, options: dict[str, Any]):
    import fsspec

    protocol = SCHEMES[scheme][1]
    if protocol == "s3":
        config = {"connect_timeout": CONNECT_TIMEOUT_S, "read_timeout": READ_TIMEOUT_S,
                  "retries": {"max_attempts": ATTEMPTS, "mode": "standard"},  # botocore's backoff: 5xx, SlowDown
                  "max_pool_connections": S3_CONNECTIONS}
        defaults = {"config_kwargs": config, "default_block_size": BLOCK_BYTES}
        if os.environ.get("SSL_CERT_FILE") and not os.environ.get("AWS_CA_BUNDLE"):
            # botocore trusts its own bundle (certifi's), not OpenSSL's variables as aiohttp and azure-core do
            defaults["client_kwargs"] = {"verify": os.environ["SSL_CERT_FILE"]}
        if os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"):
            defaults["endpoint_url"] = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ["AWS_ENDPOINT_URL"]
    elif protocol in ("http", "https"):
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S)
        defaults = {"client_kwargs": {"timeout": timeout}, "block_size": BLOCK_BYTES}
        if os.environ.get("SSL_CERT_FILE") or os.environ.get("SSL_CERT_DIR"):
            defaults["get_client"] = functools.partial(
                _http_client, os.environ.get("SSL_CERT_FILE") or None, os.environ.get("SSL_CERT_DIR") or None)
    else:  # adlfs: azure-core's own retry policy, with these timeouts
        defaults = {"connection_timeout": int(CONNECT_TIMEOUT_S), "read_timeout": int(READ_TIMEOUT_S),
                    "blocksize": BLOCK_BYTES}
    merged = {**defaults, **options}
    for name in ("config_kwargs", "client_kwargs"):  # a timeout given alone keeps the other defaults (retries...)
        if isinstance(defaults.get(name), dict) and isinstance(options.get(name), Mapping):
            merged[name] = {**defaults[name], **options[name]}
    # a copy: botocore rewrites the nested dicts it is given (retries' max_attempts), which are the options given
    # with the URL, so the next lookup would find other options and make a second file system
    fs = fsspec.filesystem(protocol, **copy.deepcopy(merged), skip_instance_cache=True)
    if protocol == "s3":
        # botocore's standard mode retries inside each call and ``retried`` around it: s3fs's own 5 tries more would
        # multiply them (a stalled endpoint waited for 125 read timeouts)
        fs.retries = 1
    return fs


async def _http_client(cafile: str | None, capath: str | None, **kwargs):
    """fsspec's HTTP session, trusting the bundle ``SSL_CERT_FILE`` (and folder ``SSL_CERT_DIR``) named when the file
    system was made: aiohttp's own default context reads them once, when aiohttp is first imported."""
    import ssl

    import aiohttp

    context = ssl.create_default_context(cafile=cafile, capath=capath)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context), **kwargs)


def _untrusted(error: BaseException) -> bool:
    """A TLS certificate this process does not trust (trying again cannot help)."""
    return bool(re.search(r"CERTIFICATE_VERIFY_FAILED|CertVerificationError|certificate verify failed",
                          f"{type(error).__name__} {error}"))


def _retryable(error: BaseException) -> bool:
    """A dropped connection, a timeout, a 5xx or a throttle: worth another try. Not a missing object, a refusal or a
    wrong argument (they would fail alike)."""
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
                          UnsupportedSchemeError, TypeError)):
        return False
    status = getattr(error, "status", None) or getattr(error, "status_code", None)
    if isinstance(status, int):
        return status >= 500 or status in (408, 429)
    text = f"{type(error).__name__} {error}"
    return bool(re.search(r"Timeout|Connect|Disconnect|Reset|SlowDown|Throttl|ServerError|Unavailable|"
                          r"Payload|IncompleteRead|EndpointConnection|5\d\d", text))


def retried(url: str, what: str, call: Callable[[], T], attempts: int = ATTEMPTS) -> T:
    """``call()``, tried again after a retryable failure (``_retryable``) with exponential backoff, ``attempts``
    times at most; the last error is raised as an ``OSError`` naming the URL, what failed and the fix.

    Raises:
      FileNotFoundError: no object at ``url``.
      PermissionError: the store refused these credentials.
      OSError: the store still failed after ``attempts`` tries.
    """
    for attempt in range(attempts):
        try:
            return call()
        except PermissionError as e:
            raise PermissionError(
                f"{_shown(url)}: {what} refused ({_error(e)}); check the credentials (environment, config files or "
                "storage options) and their access to this bucket") from None
        except Exception as e:  # noqa: BLE001 (every library raises its own errors; sorted by _retryable)
            # fsspec's HTTP file system answers FileNotFoundError to any failure (a 503 too): its cause says which
            cause = (e.__cause__ or e.__context__) if isinstance(e, FileNotFoundError) else e
            if cause is not None and _untrusted(cause):
                raise OSError(f"{_shown(url)}: {what} failed: its TLS certificate is not trusted here "
                              f"({_error(cause)}); {TLS_FIX}") from None
            if isinstance(e, FileNotFoundError) and (cause is None or not _retryable(cause)):
                raise FileNotFoundError(f"{_shown(url)}: no such object ({_error(e)})") from None
            if (getattr(cause, "status", None) or getattr(cause, "status_code", None)) in (401, 403):
                raise PermissionError(  # azure-core's HttpResponseError is no PermissionError, unlike s3fs's
                    f"{_shown(url)}: {what} refused ({_error(cause)}); check the credentials (environment, config "
                    "files or storage options) and their access to this bucket or container") from None
            if not _retryable(cause) or attempt == attempts - 1:
                tried = f" after {attempt + 1} attempts" if attempt else ""
                raise OSError(
                    f"{_shown(url)}: {what} failed{tried} ({_error(cause)}); check the URL, the endpoint and the "
                    "network, or try again later") from None
            delay = min(BACKOFF_MAX_S, BACKOFF_S * 2**attempt) * (0.5 + random.random() / 2)
            log.info("%s: %s failed (%s); trying again in %.1f s", _shown(url), what, _error(cause), delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _error(error: BaseException) -> str:
    """An exception as one short line, secrets replaced."""
    return redact(f"{type(error).__name__}: {error}".splitlines()[0][:300])


def _info(url: str) -> dict:
    fs = filesystem(url)
    fs.invalidate_cache(url)  # a listing cached earlier must not answer for the object now (the epoch checks)
    return retried(url, "reading its metadata", lambda: fs.info(url))


def stat(url: str) -> tuple[int, int, str] | None:
    """``(size, mtime in ns or 0, etag or "")`` of the object at ``url``; None when ``url`` is a folder (a prefix).
    On Azure the etag is the blob's Content-MD5 in hex where it has one (a blob sent in one request), else its ETag.

    Raises:
      FileNotFoundError: nothing there.
    """
    info = _info(url)
    if info.get("type") == "directory":
        return None
    size = info.get("size")
    if size is None:
        raise OSError(f"{_shown(url)}: the server gives no size for it (got no Content-Length); serve it with one")
    when = info.get("LastModified") or info.get("last_modified") or info.get("mtime")
    mtime = int(when.timestamp() * 1e9) if hasattr(when, "timestamp") else 0
    etag = str(info.get("ETag") or info.get("etag") or "")
    md5 = (info.get("content_settings") or {}).get("content_md5") if scheme_of(url) in ("az", "abfs") else None
    if md5:  # Azure's ETag is no checksum; the MD5 it keeps of a blob sent in one request is
        etag = bytes(md5).hex()
    return int(size), mtime, etag


def size(url: str) -> int:
    """Bytes of the object at ``url``.

    Raises:
      FileNotFoundError: nothing there, or a folder.
    """
    found = stat(url)
    if found is None:
        raise IsADirectoryError(f"{_shown(url)}: a folder, not an object")
    return found[0]


def exists(url: str) -> bool:
    """Whether an object or a folder (a prefix of objects) is at ``url``. Over HTTP, only an object is seen."""
    try:
        _info(url)  # not fs.exists: it answers False to a 503 or a timeout
    except FileNotFoundError:
        return False
    return True


def isdir(url: str) -> bool:
    """Whether ``url`` is a folder (a prefix holding objects); False over HTTP, which cannot list."""
    if not lists(url):
        return False
    fs = filesystem(url)
    fs.invalidate_cache(url)
    return retried(url, "looking it up", lambda: fs.isdir(url))


def listdir(url: str) -> list[str]:
    """The names directly under the folder ``url``, sorted (a sub-folder once, without its slash).

    Raises:
      ValueError: an HTTP URL (a web server gives no listing a program can rely on).
      FileNotFoundError: nothing under it.
    """
    if not lists(url):
        raise ValueError(f"{_shown(url)}: an HTTP server cannot list a folder (got a {scheme_of(url)}:// URL); pass "
                         "the object's own URL")
    fs = filesystem(url)
    fs.invalidate_cache(url)
    entries = retried(url, "listing it", lambda: fs.ls(url, detail=False))
    return sorted({entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries})


def open_for_reading(url: str):
    """A binary file object reading the object at ``url`` (seekable, read ahead in ``BLOCK_BYTES`` blocks); the
    open is retried as ``retried`` says. A read that fails later raises that library's error (a caller that
    downloads retries the whole object, ``readers/shard_cache/store.py``).

    Raises:
      FileNotFoundError: nothing there.
    """
    fs = filesystem(url)
    return retried(url, "opening it", lambda: fs.open(url, "rb"))


def read_bytes(url: str, limit: int) -> bytes:
    """At most ``limit`` bytes of the object at ``url``, read from its start (a whole small object, retried)."""
    def read() -> bytes:
        with filesystem(url).open(url, "rb") as f:
            return f.read(limit)

    return retried(url, "reading it", read)


# --- writing (``tools/push.py``): each call one object, retried as ``retried`` says ---------------------------------


def writes(path: str) -> bool:
    """Whether tfshard writes datasets to ``path``'s store (``s3://``, ``az://``, ``abfs://``: not plain HTTP)."""
    return scheme_of(path) in LISTS


def put_bytes(url: str, data: bytes) -> str | None:
    """Writes ``data`` as the object at ``url`` in one request (replacing one there), retried on a dropped connection,
    a timeout, a 5xx or a throttle. An S3 PUT lands whole or not at all: no reader sees half of it.

    Returns:
      The ETag the store answered a one-request S3 upload with (the MD5 of the bytes it received, quoted), else None
      (a multipart upload, Azure): ask ``stat`` for it.

    Example:
      put_bytes("s3://bucket/ds/inputs.json", b"{}")   # '"99914b932bd37a50b983c5e7c90ae93b"'
    """
    fs = filesystem(url)
    parts = {"chunksize": PART_BYTES} if scheme_of(url) == "s3" else {}  # so s3_etag knows the parts
    answer = retried(url, "uploading it", lambda: fs.pipe_file(url, data, **parts))
    fs.invalidate_cache(url)
    etag = answer.get("ETag") if isinstance(answer, dict) else None
    return etag if isinstance(etag, str) else None


def s3_etag(data: bytes) -> str:
    """The ETag S3 gives the object ``put_bytes`` wrote from ``data``: its MD5 when sent in one request (below two
    parts), else the MD5 of its ``PART_BYTES`` parts' MD5s and their count (S3's multipart ETag).

    Example:
      s3_etag(b"")   # "d41d8cd98f00b204e9800998ecf8427e"
    """
    import hashlib

    if len(data) < 2 * PART_BYTES:
        return hashlib.md5(data, usedforsecurity=False).hexdigest()
    parts = [hashlib.md5(data[i:i + PART_BYTES], usedforsecurity=False).digest()
             for i in range(0, len(data), PART_BYTES)]
    return f"{hashlib.md5(b''.join(parts), usedforsecurity=False).hexdigest()}-{len(parts)}"


def landed_tag(url: str, data: bytes) -> str:
    """The etag ``stat`` gives the object ``put_bytes`` wrote from ``data`` where the store's tag is a checksum: on S3
    its ETag (``s3_etag``), on Azure the MD5 of the blob, in hex (what a whole upload is checked against).

    Example:
      landed_tag("az://container/ds/x", b"")   # "d41d8cd98f00b204e9800998ecf8427e"
    """
    import hashlib

    return s3_etag(data) if scheme_of(url) == "s3" else hashlib.md5(data, usedforsecurity=False).hexdigest()


def delete(url: str) -> None:
    """Removes the object at ``url``; nothing there is no error."""
    fs = filesystem(url)

    def remove() -> None:
        try:
            fs.rm_file(url)
        except FileNotFoundError:
            pass

    retried(url, "removing it", remove)
    fs.invalidate_cache(url)


def list_objects(url: str) -> list[str]:
    """Every object under the folder ``url``, at any depth, as a path relative to it, sorted ([] when none).

    Raises:
      ValueError: an HTTP URL (a web server gives no listing).
    """
    if not lists(url):
        raise ValueError(f"{_shown(url)}: an HTTP server cannot list a folder (got a {scheme_of(url)}:// URL); pass "
                         "an s3://, az:// or abfs:// URL")
    fs = filesystem(url)
    fs.invalidate_cache(url)
    root = fs._strip_protocol(url).rstrip("/")
    found = retried(url, "listing it", lambda: fs.find(root))
    return sorted(path[len(root) + 1:] for path in found if path.startswith(root + "/"))
