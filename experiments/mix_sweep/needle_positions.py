"""Where a recipe's task rows put their needles: needle position against needle-to-question distance.

    python -m experiments.mix_sweep.needle_positions RECIPE.yaml [ROWS]

Builds ``ROWS`` rows (300 by default) of the recipe's first task source on a noise haystack (positions depend
on lengths, not on the filler) and prints, per eighth of the distance span, how many samples fall in it and
the median and largest needle position (PoSE skips included), then how many needles closer than an eighth of
the span to their question sit past half and three quarters of it: where an evaluation's depth 100 at the
target puts them.
"""

import argparse
import statistics


def main(argv: list[str] | None = None) -> None:
    """Print the needle positions by distance."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("recipe", help="the recipe file (e.g. runs/sweep/NAME.yaml, written by the arm)")
    parser.add_argument("rows", type=int, nargs="?", default=300, help="rows to build (default 300)")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from ctxext.models.sources import load_config
    from ctxext.recipe.schema import load_recipe
    from ctxext.training.data.mixture import preview_draws

    recipe = load_recipe(args.recipe)
    rows = args.rows
    _, folder = load_config(recipe.model.path, recipe.model.revision)
    key, draws = next(iter(preview_draws(recipe, AutoTokenizer.from_pretrained(folder), rows).items()))
    span = draws.span
    print(f"{key}: {len(draws.realised)} samples in {rows} rows, placement {draws.placement}, span {span}")
    pairs = list(zip(draws.realised, draws.positions, strict=True))
    for k in range(8):
        got = [p for d, p in pairs if k * span // 8 <= d < (k + 1) * span // 8]
        if got:
            print(
                f"  distance {k * span // 8}-{(k + 1) * span // 8 - 1}: {len(got)} samples, needle position "
                f"median {statistics.median(got):g}, max {max(got)}"
            )
    near = [p for d, p in pairs if d < span // 8]
    print(
        f"  needles closer than {span // 8}: {len(near)}; past position {span // 2}: "
        f"{sum(p >= span // 2 for p in near)}; past {3 * span // 4}: {sum(p >= 3 * span // 4 for p in near)}"
    )


if __name__ == "__main__":
    main()
