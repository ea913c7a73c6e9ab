"""`shopsim catalog build|info`: generate (and cache) a seeded catalog and its search index, or describe one."""

from __future__ import annotations

import argparse
import time

from shopsim.app.commands import positive_int, writable_output


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser("catalog", help="build or describe a seeded product catalog",
                       description="Build a seeded product catalog (Parquet + search index) or describe one.")
    csub = p.add_subparsers(dest="catalog_command", metavar="{build,info}", required=True)

    b = csub.add_parser("build", help="generate a catalog, write its Parquet file and build its search index")
    b.add_argument("--size", type=positive_int, default=10_000, help="number of products (1 .. 4,000,000)")
    b.add_argument("--seed", type=_seed, default=0, help="catalog seed (same seed -> byte-identical file)")
    b.add_argument("--out", default=None,
                   help="folder to write the Parquet file to (default: the cache, $SHOPSIM_CACHE_DIR/catalog)")
    b.add_argument("--no-index", action="store_true", help="skip building the search index")
    b.add_argument("--backend", default=None, help="search backend: tantivy (default) or bm25s")
    b.set_defaults(func=run_build)

    i = csub.add_parser("info", help="categories, types, counts, price statistics and cache paths")
    i.add_argument("--size", type=positive_int, default=10_000)
    i.add_argument("--seed", type=_seed, default=0)
    i.add_argument("--file", default=None, help="describe this catalog Parquet file instead")
    i.set_defaults(func=run_info)


def run_build(args: argparse.Namespace) -> int:
    from shopsim.catalog import build_catalog, catalog_path, load_catalog
    from shopsim.catalog.search import resolve_backend

    backend = None if args.no_index else resolve_backend(args.backend)  # fail before the long part
    out = writable_output(args.out, is_dir=True) if args.out else None
    t0 = time.perf_counter()
    if out is None:
        cat = load_catalog(args.size, args.seed)
        path = cat.path
    else:
        cat = build_catalog(args.size, args.seed)
        path = cat.write_parquet(out / catalog_path(args.size, args.seed).name)
    print(f"catalog: {len(cat):,} products, seed {cat.seed} -> {path} ({time.perf_counter() - t0:.2f} s)")
    _summary(cat)
    if backend:
        t0 = time.perf_counter()
        index = cat.index(backend)
        print(f"search index ({index.backend}): {len(index):,} documents -> {getattr(index, 'path', 'memory')} "
              f"({time.perf_counter() - t0:.2f} s)")
    return 0


def run_info(args: argparse.Namespace) -> int:
    from shopsim.catalog import load_catalog, read_catalog
    from shopsim.errors import ShopsimError

    if args.file:
        try:
            cat = read_catalog(args.file)
        except FileNotFoundError:
            raise ShopsimError(f"no such file {args.file}; give the path of a catalog Parquet file") from None
        except Exception as exc:  # noqa: BLE001 - any unreadable file is a user error here
            raise ShopsimError(f"{args.file} is not a readable shopsim catalog ({exc})") from None
    else:
        cat = load_catalog(args.size, args.seed)
    print(f"catalog: {len(cat):,} products, seed {cat.seed}, file {cat.path}")
    _summary(cat)
    from shopsim.catalog.search import BACKENDS, index_path

    for backend in BACKENDS:
        p = index_path(cat, backend)
        print(f"search index {backend}: {p} ({'built' if p.exists() else 'not built'})")
    return 0


def _summary(cat) -> None:
    import numpy as np

    price, rating = cat.prices, cat.table.column("rating").to_numpy()
    stock = cat.table.column("stock").to_numpy()
    print(f"{len(cat.categories)} categories, {len(cat.product_types)} product types, "
          f"{len(set(cat.table.column('brand').to_pylist())) if len(cat) <= 200_000 else 'many'} brands")
    print(f"price: min {price.min():.2f}  median {np.median(price):.2f}  mean {price.mean():.2f}  "
          f"max {price.max():.2f}; rating mean {rating.mean():.2f}; out of stock {np.mean(stock == 0):.1%}")
    counts = np.bincount(cat.category_ids, minlength=len(cat.categories))
    tcounts = np.bincount(cat.type_ids, minlength=len(cat.product_types))
    types_of: dict[int, list] = {c: [] for c in range(len(cat.categories))}
    from shopsim.catalog.taxonomy import tables

    for t, c in enumerate(tables().type_category):
        types_of[int(c)].append(t)
    for c, name in enumerate(cat.categories):
        ts = ", ".join(f"{cat.product_types[t]} {tcounts[t]:,}" for t in types_of[c])
        print(f"  {name:<12} {counts[c]:>9,}  ({ts})")
