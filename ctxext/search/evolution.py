"""LongRoPE's evolutionary search over monotone per-dimension factors (no torch: numbers in, numbers out).

One generation (Ding et al. 2024, Alg. 1; their reference implementation's sizes): the best half of
the population are the parents; a quarter of the population are mutants of random parents and a
quarter are crossovers of two random parents; parents + children form the next population. Only
children are evaluated (parents keep their scores), candidates already evaluated are never generated
again, and every operator keeps the factors monotone:

* **mutation**: each dimension, with probability ``mutation_rate``, is redrawn on a ``step`` grid
  between its current neighbours (``λ_{i−1} ≤ λ_i ≤ λ_{i+1}``; the outer bounds at the ends), so the
  result is monotone by construction;
* **crossover**: a random segment ``[a, b)`` of the second parent replaces the first parent's; a child
  that is not monotone (or not new) is rejected and redrawn, and after ``crossover_tries`` rejections
  the first parent is mutated instead (as in LongRoPE).

**The attention factor as a gene** (optional, ``Evolution.attention``): a vector then carries one more
value after the factors, the attention factor, bounded by its own range and outside the monotonicity
constraint; a mutation redraws it (with the same probability as a factor) on the same grid within its
range, and a crossover segment that reaches the end of the vector takes the second parent's.

All randomness comes from one ``numpy.random.Generator`` seeded once, and candidates are generated
before they are scored, in a fixed order: the same seed and the same scores give the same candidates,
which is what lets an interrupted search be replayed from its log.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ctxext.search.factors import is_monotone


class StopSearch(Exception):
    """Raised by an evaluation callback to end the search (time budget spent)."""


@dataclass
class Candidate:
    """One evaluated (or to-be-evaluated) factor vector.

    Attributes:
        index: order of generation (0, 1, 2 …), the same in every replay.
        generation: 0 for the initial population, then 1 … generations.
        origin: ``seed:NAME``, ``mutation``, ``crossover`` or ``seed-mutation``.
        factors: ``d/2`` long factors.
        score: the objective (lower is better); None until evaluated.
    """

    index: int
    generation: int
    origin: str
    factors: np.ndarray
    score: float | None = None


@dataclass
class EvolutionSettings:
    """Sizes and operators of the search.

    Attributes:
        population: candidates per generation (LongRoPE: 64).
        generations: iterations after the initial population (LongRoPE: 40).
        mutation_rate: probability that a dimension is redrawn by a mutation.
        crossover_tries: rejected crossovers before falling back to a mutation.
        step: grid of mutated values (LongRoPE: 0.01).
        seed: the random seed.
    """

    population: int = 64
    generations: int = 40
    mutation_rate: float = 0.3
    crossover_tries: int = 20
    step: float = 0.01
    seed: int = 0

    @property
    def parents(self) -> int:
        """Parents kept per generation (half the population, at least 2)."""
        return max(2, self.population // 2)

    @property
    def children(self) -> int:
        """New candidates per generation (the other half, at least 2)."""
        return max(2, self.population - self.parents)

    def expected_evaluations(self, n_seeds: int) -> int:
        """Evaluations of a search that runs to its last generation."""
        return max(self.population, n_seeds) + self.generations * self.children


def _key(factors: np.ndarray) -> tuple[float, ...]:
    return tuple(np.round(np.asarray(factors, dtype=np.float64), 9))


@dataclass
class Evolution:
    """The search state: bounds, random generator and the set of vectors already generated.

    Attributes:
        settings: sizes and operators.
        lower: smallest factor allowed (1: never faster than the original frequency).
        upper: largest factor allowed.
        attention: ``(low, high)`` of the attention factor when it is searched too (then every vector
            ends with it); None when it is fixed.
    """

    settings: EvolutionSettings
    lower: float
    upper: float
    attention: tuple[float, float] | None = None
    rng: np.random.Generator = field(init=False)
    history: set[tuple[float, ...]] = field(init=False, default_factory=set)
    next_index: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.settings.seed)

    def _make(self, generation: int, origin: str, factors: np.ndarray) -> Candidate:
        self.history.add(_key(factors))
        cand = Candidate(self.next_index, generation, origin, np.asarray(factors, dtype=np.float64))
        self.next_index += 1
        return cand

    def n_factors(self, vector: np.ndarray) -> int:
        """How many values of ``vector`` are factors (all but a trailing attention gene)."""
        return len(vector) - (1 if self.attention is not None else 0)

    def clip(self, vector: np.ndarray) -> np.ndarray:
        """``vector`` within the bounds (factors and, when searched, the attention factor)."""
        out = np.asarray(vector, dtype=np.float64).copy()
        n = self.n_factors(out)
        out[:n] = np.clip(out[:n], self.lower, self.upper)
        if self.attention is not None:
            out[n] = min(max(out[n], self.attention[0]), self.attention[1])
        return out

    def _bounds(self, child: np.ndarray, i: int, n: int) -> tuple[float, float, float]:
        # (left, right, grid origin) of value i: a factor lies between its neighbours, the attention gene
        # within its own range.
        if i >= n:
            assert self.attention is not None
            return self.attention[0], self.attention[1], self.attention[0]
        left = child[i - 1] if i > 0 else self.lower
        right = child[i + 1] if i < n - 1 else self.upper
        return left, right, self.lower

    def mutate(self, parent: np.ndarray) -> np.ndarray:
        """A new monotone vector near ``parent`` (up to 50 draws to find one not generated before)."""
        child = np.asarray(parent, dtype=np.float64).copy()
        n, step = self.n_factors(child), self.settings.step
        for _ in range(50):
            child = np.asarray(parent, dtype=np.float64).copy()
            for i in range(len(child)):
                if self.rng.random() >= self.settings.mutation_rate:
                    continue
                left, right, lo = self._bounds(child, i, n)
                k0 = math.ceil((left - lo) / step - 1e-9)
                k1 = math.floor((right - lo) / step + 1e-9)
                if k1 < k0:
                    continue
                value = lo + step * int(self.rng.integers(k0, k1 + 1))
                # Clamp away the rounding of lo + k·step so neighbours stay ordered exactly.
                child[i] = min(max(value, left), right)
            if _key(child) not in self.history:
                break
        return child

    def crossover(self, first: np.ndarray, second: np.ndarray) -> np.ndarray | None:
        """A monotone, new child with a segment of ``second`` in ``first``; None after too many rejections."""
        n = len(first)
        for _ in range(self.settings.crossover_tries):
            a, b = sorted(int(x) for x in self.rng.choice(n + 1, size=2, replace=False))
            child = np.asarray(first, dtype=np.float64).copy()
            child[a:b] = second[a:b]
            if is_monotone(child[: self.n_factors(child)]) and _key(child) not in self.history:
                return child
        return None

    def initial(self, seeds: Sequence[tuple[str, np.ndarray]]) -> list[Candidate]:
        """Generation 0: every seed, then mutants of random seeds up to the population size."""
        out = [self._make(0, f"seed:{name}", self.clip(f)) for name, f in seeds]
        while len(out) < self.settings.population:
            parent = seeds[int(self.rng.integers(len(seeds)))][1]
            out.append(self._make(0, "seed-mutation", self.mutate(self.clip(parent))))
        return out

    def select(self, population: Sequence[Candidate]) -> list[Candidate]:
        """The parents: the best half by score (ties by generation order), unscored last."""

        def rank(c: Candidate) -> tuple[float, int]:
            score = c.score if c.score is not None and math.isfinite(c.score) else math.inf
            return score, c.index

        return sorted(population, key=rank)[: self.settings.parents]

    def offspring(self, parents: Sequence[Candidate], generation: int) -> list[Candidate]:
        """This generation's children: mutants, then crossovers (falling back to mutants)."""
        n_children = self.settings.children
        n_mut = n_children // 2
        out: list[Candidate] = []
        for _ in range(n_mut):
            parent = parents[int(self.rng.integers(len(parents)))]
            out.append(self._make(generation, "mutation", self.mutate(parent.factors)))
        for _ in range(n_children - n_mut):
            i, j = sorted(int(x) for x in self.rng.choice(len(parents), size=2, replace=False))
            child = self.crossover(parents[i].factors, parents[j].factors)
            if child is None:
                out.append(self._make(generation, "mutation", self.mutate(parents[i].factors)))
            else:
                out.append(self._make(generation, "crossover", child))
        return out


def run_evolution(
    evolution: Evolution,
    seeds: Sequence[tuple[str, np.ndarray]],
    evaluate: Callable[[Candidate], float],
    on_generation: Callable[[int, list[Candidate]], None] | None = None,
) -> tuple[list[Candidate], str]:
    """Run the search: evaluate the initial population, then ``generations`` rounds of selection and offspring.

    Args:
        evolution: the search state (fresh).
        seeds: ``(name, factors)`` of the seeds.
        evaluate: returns a candidate's score (lower is better); raises :class:`StopSearch` to end early.
        on_generation: called after each generation with its number and the evaluated population.

    Returns:
        ``(every evaluated candidate in order, why it ended: "generations" or "budget")``.
    """
    evaluated: list[Candidate] = []

    def score_all(cands: list[Candidate]) -> None:
        for cand in cands:
            cand.score = float(evaluate(cand))
            evaluated.append(cand)

    try:
        population = evolution.initial(seeds)
        score_all(population)
        if on_generation is not None:
            on_generation(0, population)
        for generation in range(1, evolution.settings.generations + 1):
            parents = evolution.select(population)
            children = evolution.offspring(parents, generation)
            score_all(children)
            population = parents + children
            if on_generation is not None:
                on_generation(generation, population)
    except StopSearch:
        return evaluated, "budget"
    return evaluated, "generations"


def best(candidates: Sequence[Candidate]) -> Candidate:
    """The best evaluated candidate (lowest score; the earliest on ties)."""
    scored = [c for c in candidates if c.score is not None and math.isfinite(c.score)]
    if not scored:
        raise ValueError("no candidate has a finite score")
    return min(scored, key=lambda c: (c.score, c.index))
