"""The product taxonomy (`data/taxonomy.json`) and its flat, array-indexed form used by the generator.

The JSON file is the single source of truth: categories -> product types -> price range, attribute vocabulary and
option dimensions (values written ``"@name"`` refer to the shared ``option_sets`` and are expanded here), plus brand
names and short marketing blurbs per category. `load_taxonomy` returns the expanded dict (what `Catalog.taxonomy`
exposes); `TaxonomyTables` flattens it into numpy offset/count arrays so that catalog generation is pure numpy
indexing (one row per type, one row per (type, option dimension) pair).
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from shopsim.errors import ShopsimError
from shopsim.paths import data_dir


def taxonomy_path() -> Path:
    return data_dir() / "taxonomy.json"


@lru_cache(maxsize=4)
def _load(path: str) -> tuple[dict, str]:
    raw = Path(path).read_bytes()
    try:
        tax = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ShopsimError(f"{path} is not valid JSON ({exc}); fix the taxonomy file") from exc
    sets = tax.get("option_sets", {})
    seen_types: set[str] = set()
    for cname, cat in tax["categories"].items():
        if not cat.get("brands") or not cat.get("types"):
            raise ShopsimError(f"taxonomy category {cname!r} needs non-empty 'brands' and 'types'")
        for tname, t in cat["types"].items():
            if tname in seen_types:
                raise ShopsimError(f"taxonomy product type {tname!r} appears twice; type names must be unique")
            seen_types.add(tname)
            lo, hi = t["price"]
            if not 0 < lo <= hi:
                raise ShopsimError(f"taxonomy type {tname!r}: price range {t['price']} must satisfy 0 < lo <= hi")
            if not t.get("attributes") or not t.get("options"):
                raise ShopsimError(f"taxonomy type {tname!r} needs non-empty 'attributes' and 'options'")
            for dim, values in list(t["options"].items()):
                if isinstance(values, str):
                    if not values.startswith("@") or values[1:] not in sets:
                        raise ShopsimError(f"taxonomy type {tname!r} option {dim!r}: unknown option set {values!r}")
                    t["options"][dim] = list(sets[values[1:]])
    # the hash covers what generation reads: editing the synonyms (instructions only) keeps cached catalogs valid
    generated = {k: v for k, v in json.loads(raw).items() if k not in ("synonyms", "description")}
    return tax, hashlib.sha256(json.dumps(generated, sort_keys=True).encode()).hexdigest()[:16]


def load_taxonomy(path: str | Path | None = None) -> dict:
    """The parsed taxonomy with option-set references expanded (a fresh copy: callers may mutate it)."""
    return copy.deepcopy(_load(str(path or taxonomy_path()))[0])


def taxonomy_hash(path: str | Path | None = None) -> str:
    """Short content hash of the generation-relevant part of the taxonomy file (everything but ``description`` and
    ``synonyms``): cached catalogs built from another taxonomy are not trusted."""
    return _load(str(path or taxonomy_path()))[1]


def _title_case(text: str) -> str:
    # str.title() would turn "70 percent" into "70 Percent" (fine) but "4k" into "4K" and "t-shirt" into
    # "T-Shirt"; capitalising only the first letter of each word keeps model names like "usb c" readable.
    return " ".join(w[:1].upper() + w[1:] for w in text.split(" "))


@dataclass(frozen=True)
class TaxonomyTables:
    """Flat arrays over the taxonomy (built once per process)."""

    categories: list[str]
    types: list[str]
    type_category: np.ndarray  # int32 [T]
    price_lo: np.ndarray  # float64 [T]
    price_hi: np.ndarray
    attr_vocab: list[str]  # global attribute strings; type t owns attr_off[t] : attr_off[t] + attr_cnt[t]
    attr_off: np.ndarray
    attr_cnt: np.ndarray
    dim_names: list[str]  # one row per (type, option dimension)
    dim_off: np.ndarray  # type t owns dims dim_off[t] : dim_off[t] + dim_cnt[t]
    dim_cnt: np.ndarray
    value_vocab: list[str]  # dimension d owns values val_off[d] : val_off[d] + val_cnt[d]
    val_off: np.ndarray
    val_cnt: np.ndarray
    blurbs: list[str]  # category c owns blurbs blurb_off[c] : blurb_off[c] + blurb_cnt[c]
    blurb_off: np.ndarray
    blurb_cnt: np.ndarray
    base_brands: list[list[str]]  # per category, from the file

    @property
    def max_attrs(self) -> int:
        return int(self.attr_cnt.max())

    @property
    def max_dims(self) -> int:
        return int(self.dim_cnt.max())

    @property
    def max_values(self) -> int:
        return int(self.val_cnt.max())

    def titled(self, words: list[str]) -> list[str]:
        return [_title_case(w) for w in words]


@lru_cache(maxsize=4)
def tables(path: str | None = None) -> TaxonomyTables:
    tax = _load(str(path or taxonomy_path()))[0]
    categories, types, type_cat, lo, hi = [], [], [], [], []
    attr_vocab: list[str] = []
    dim_names: list[str] = []
    values: list[str] = []
    blurbs: list[str] = []
    attr_off, attr_cnt, dim_off, dim_cnt, val_off, val_cnt, blurb_off, blurb_cnt, base_brands = (
        [], [], [], [], [], [], [], [], [])
    for ci, (cname, cat) in enumerate(tax["categories"].items()):
        categories.append(cname)
        base_brands.append(list(cat["brands"]))
        blurb_off.append(len(blurbs))
        blurb_cnt.append(len(cat.get("blurbs", [])) or 1)
        blurbs.extend(cat.get("blurbs", []) or [""])
        for tname, t in cat["types"].items():
            types.append(tname)
            type_cat.append(ci)
            lo.append(float(t["price"][0]))
            hi.append(float(t["price"][1]))
            attr_off.append(len(attr_vocab))
            attr_cnt.append(len(t["attributes"]))
            attr_vocab.extend(t["attributes"])
            dim_off.append(len(dim_names))
            dim_cnt.append(len(t["options"]))
            for dname, dvals in t["options"].items():
                dim_names.append(dname)
                val_off.append(len(values))
                val_cnt.append(len(dvals))
                values.extend(dvals)

    def i32(x):
        return np.asarray(x, dtype=np.int32)

    return TaxonomyTables(
        categories=categories, types=types, type_category=i32(type_cat),
        price_lo=np.asarray(lo), price_hi=np.asarray(hi),
        attr_vocab=attr_vocab, attr_off=i32(attr_off), attr_cnt=i32(attr_cnt),
        dim_names=dim_names, dim_off=i32(dim_off), dim_cnt=i32(dim_cnt),
        value_vocab=values, val_off=i32(val_off), val_cnt=i32(val_cnt),
        blurbs=blurbs, blurb_off=i32(blurb_off), blurb_cnt=i32(blurb_cnt), base_brands=base_brands,
    )


def synonyms(path: str | Path | None = None) -> dict[str, list[str]]:
    """The taxonomy's ``synonyms`` table: a type, attribute or option value -> other wordings of it (none of which
    contains the original as a word). Catalog generation never reads it; paraphrased instructions do."""
    return _load(str(path or taxonomy_path()))[0].get("synonyms", {})
