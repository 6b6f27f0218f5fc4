"""The cache of derived tensors (worker/tensor_cache.py): built once, read back as built, and never used when
its file is truncated or corrupted, was written for another recipe, or for another torch or CPU."""

from __future__ import annotations

import shutil

import torch

from worker.tensor_cache import CHECK, TENSORS, cached_tensors, environment_key


class Builder:
    """Counts its builds; the tensors depend on the recipe's seed, as a derived format depends on its weights."""

    def __init__(self, seed: int = 0):
        self.seed, self.builds = seed, 0

    def __call__(self) -> dict[str, torch.Tensor]:
        self.builds += 1
        generator = torch.Generator().manual_seed(self.seed)
        return {"0.weight": torch.randint(-63, 64, (64, 32), dtype=torch.int8, generator=generator),
                "0.scales": torch.rand(64, dtype=torch.float64, generator=generator)}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def _entry(directory):
    (entry,) = [p for p in directory.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return entry


def test_built_once_then_read_back_as_built(tmp_path):
    build = Builder()
    first = cached_tensors(tmp_path, "recipe-a", build)
    again = cached_tensors(tmp_path, "recipe-a", build)
    assert build.builds == 1 and _same(first, again) and _same(first, Builder()())


def test_a_truncated_file_is_rebuilt(tmp_path):
    build = Builder()
    cached_tensors(tmp_path, "recipe-a", build)
    tensors = _entry(tmp_path) / TENSORS
    tensors.write_bytes(tensors.read_bytes()[:-100])
    assert _same(cached_tensors(tmp_path, "recipe-a", build), Builder()())
    assert build.builds == 2
    assert _same(cached_tensors(tmp_path, "recipe-a", build), Builder()()) and build.builds == 2  # sound again


def test_a_corrupted_byte_is_rebuilt(tmp_path):
    build = Builder()
    cached_tensors(tmp_path, "recipe-a", build)
    tensors = _entry(tmp_path) / TENSORS
    data = bytearray(tensors.read_bytes())
    data[-1] ^= 0x01  # the same size, one weight off by a bit
    tensors.write_bytes(bytes(data))
    assert _same(cached_tensors(tmp_path, "recipe-a", build), Builder()()) and build.builds == 2


def test_a_file_from_another_recipe_is_not_used(tmp_path):
    """Another recipe's entry, complete and sound, copied under this recipe's name: its key differs, so it
    is discarded and this recipe's tensors are built."""
    other, mine = tmp_path / "other", tmp_path / "mine"
    cached_tensors(other, "recipe-b", Builder(seed=1))
    build = Builder(seed=0)
    cached_tensors(mine, "recipe-a", build)
    for name in (TENSORS, CHECK):
        shutil.copyfile(_entry(other) / name, _entry(mine) / name)
    assert _same(cached_tensors(mine, "recipe-a", build), Builder(seed=0)()) and build.builds == 2


def test_another_torch_version_or_cpu_gets_its_own_entry(tmp_path, monkeypatch):
    assert torch.__version__ in environment_key() and torch.backends.cpu.get_cpu_capability() in environment_key()
    build = Builder()
    cached_tensors(tmp_path, "recipe-a", build)
    monkeypatch.setattr(torch, "__version__", "0.0.1-other")
    cached_tensors(tmp_path, "recipe-a", build)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "OTHER")
    cached_tensors(tmp_path, "recipe-a", build)
    assert build.builds == 3 and len([p for p in tmp_path.iterdir() if not p.name.startswith(".")]) == 3


def test_an_unwritable_cache_only_costs_the_build(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    build = Builder()
    assert _same(cached_tensors(blocked / "cache", "recipe-a", build), Builder()()) and build.builds == 1
