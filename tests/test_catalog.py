"""The embedded catalog, its invariants, and user catalog files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from energyopt.catalog import builtin_catalog, load_catalog_file, load_problem
from energyopt.spec import GpuType, LlmModel, SpecError

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "tests" / "data" / "sample-instance.yaml"

REQUIRED_GPUS = ["A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB", "L40S", "L4"]
REQUIRED_MODELS = ["Llama-3.1-8B", "Llama-3.1-70B", "Mistral-7B", "Qwen2.5-14B", "Mixtral-8x7B"]

CATALOG = builtin_catalog()
GPU_NAMES = sorted(CATALOG.gpus)
MODEL_NAMES = sorted(CATALOG.models)


# ---------------------------------------------------------------- the embedded catalog


def test_embedded_catalog_has_required_entries() -> None:
    assert set(REQUIRED_GPUS) <= set(CATALOG.gpus)
    assert set(REQUIRED_MODELS) <= set(CATALOG.models)
    for name, gpu in CATALOG.gpus.items():
        assert isinstance(gpu, GpuType)
        assert gpu.name == name
    for name, model in CATALOG.models.items():
        assert isinstance(model, LlmModel)
        assert model.name == name


def test_lookup_by_name_and_close_matches() -> None:
    assert CATALOG.gpu("L40S").name == "L40S"
    assert CATALOG.model("Mistral-7B").name == "Mistral-7B"
    with pytest.raises(KeyError, match="did you mean 'H200-SXM-141GB'"):
        CATALOG.gpu("H200")
    with pytest.raises(KeyError, match=r"unknown model 'llama-3\.1-70b'.*'Llama-3\.1-70B'"):
        CATALOG.model("llama-3.1-70b")


@pytest.mark.parametrize("name", GPU_NAMES + MODEL_NAMES)
def test_every_entry_cites_its_sources(name: str) -> None:
    entry: GpuType | LlmModel = CATALOG.gpus.get(name) or CATALOG.models[name]
    assert entry.sources, f"{name} has no sources"
    assert all(isinstance(v, str) and v.strip() for v in entry.sources.values())
    # every figure written in the entry file is cited, and every citation is for a field
    written = entry.model_fields_set - {"name", "sources"}
    assert written <= set(entry.sources), sorted(written - set(entry.sources))
    assert set(entry.sources) <= set(type(entry).model_fields)


@pytest.mark.parametrize("name", GPU_NAMES)
def test_gpu_invariants(name: str) -> None:
    gpu = CATALOG.gpus[name]
    assert 0 < gpu.idle_w < gpu.tdp_w
    assert gpu.power_limit_min_w <= gpu.tdp_w <= gpu.power_limit_max_w
    assert gpu.min_sm_clock_mhz <= gpu.default_sm_clock_mhz <= gpu.max_sm_clock_mhz
    clocks = gpu.sm_clocks_mhz()
    assert list(clocks) == sorted(set(clocks)), "clocks not strictly ascending"
    assert clocks[0] == gpu.min_sm_clock_mhz
    assert clocks[-1] == gpu.max_sm_clock_mhz
    assert gpu.default_sm_clock_mhz in clocks
    assert gpu.nearest_clocks_mhz(gpu.max_sm_clock_mhz + 500, 1) == (gpu.max_sm_clock_mhz,)
    assert gpu.mig_total_slices <= 7
    for profile in gpu.mig_profiles:
        assert profile.compute_slices <= gpu.mig_total_slices <= 7
        assert profile.memory_gb <= gpu.memory_gb
        assert profile.sm_count <= gpu.sm_count
        assert profile.compute_slices * profile.max_instances <= gpu.mig_total_slices
        assert gpu.mig_profile(profile.name) is profile


def test_mig_gpus_have_profiles_and_a_full_gpu_profile() -> None:
    for name in ["A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB"]:
        gpu = CATALOG.gpus[name]
        full = [p for p in gpu.mig_profiles if p.compute_slices == gpu.mig_total_slices]
        assert len(full) == 1
        assert full[0].memory_gb == gpu.memory_gb
    with pytest.raises(KeyError):
        CATALOG.gpus["L4"].mig_profile("1g.10gb")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_invariants(name: str) -> None:
    model = CATALOG.models[name]
    assert model.kv_heads <= model.heads
    assert model.heads % model.kv_heads == 0
    assert model.experts_per_token <= model.experts
    if model.experts == 1:
        assert model.params_active_b == model.params_total_b
        assert model.experts_per_token == 1
    else:
        assert model.params_active_b < model.params_total_b
    assert model.weight_bytes == pytest.approx(model.params_total_b * 1e9 * model.bytes_per_param)


def test_mixtral_is_sparse() -> None:
    mixtral = CATALOG.models["Mixtral-8x7B"]
    assert mixtral.experts == 8
    assert mixtral.experts_per_token == 2
    assert mixtral.params_active_b < mixtral.params_total_b / 2
    for dense in ["Llama-3.1-8B", "Llama-3.1-70B", "Mistral-7B", "Qwen2.5-14B"]:
        model = CATALOG.models[dense]
        assert model.params_active_b == model.params_total_b


def test_catalog_sizes_are_plausible() -> None:
    """Cheap cross-checks between figures, to catch a unit slip in an entry file."""
    assert CATALOG.gpus["H200-SXM-141GB"].memory_gb > CATALOG.gpus["H100-SXM5-80GB"].memory_gb
    assert CATALOG.models["Llama-3.1-70B"].weight_bytes / 1e9 == pytest.approx(141, rel=0.02)
    assert CATALOG.models["Llama-3.1-8B"].weight_bytes / 1e9 == pytest.approx(16, rel=0.02)


def test_gpu_type_rejects_inconsistent_figures() -> None:
    base = CATALOG.gpus["L4"].model_dump(exclude={"sources"})
    with pytest.raises(ValueError, match="idle_w must be below tdp_w"):
        GpuType.model_validate({**base, "idle_w": base["tdp_w"]})
    with pytest.raises(ValueError, match="default_sm_clock_mhz is outside"):
        GpuType.model_validate({**base, "default_sm_clock_mhz": base["max_sm_clock_mhz"] + 1})
    with pytest.raises(ValueError, match="min_sm_clock_mhz exceeds max_sm_clock_mhz"):
        GpuType.model_validate({**base, "min_sm_clock_mhz": base["max_sm_clock_mhz"] + 15})
    with pytest.raises(ValueError, match="power_limit_min_w exceeds power_limit_max_w"):
        GpuType.model_validate({**base, "power_limit_min_w": base["power_limit_max_w"] + 1})


def test_explicit_clock_list_is_sorted_and_deduplicated() -> None:
    base = CATALOG.gpus["L4"].model_dump(exclude={"sources"})
    gpu = GpuType.model_validate({**base, "supported_sm_clocks_mhz": [2040, 210, 1000, 1000]})
    assert gpu.sm_clocks_mhz() == (210, 1000, 2040)
    assert gpu.nearest_clocks_mhz(900) == (210, 1000)


def test_generated_clock_list_ends_at_max_off_the_step() -> None:
    base = CATALOG.gpus["L4"].model_dump(exclude={"sources"})
    gpu = GpuType.model_validate(
        {**base, "min_sm_clock_mhz": 100, "default_sm_clock_mhz": 100, "max_sm_clock_mhz": 135}
    )
    assert gpu.sm_clocks_mhz() == (100, 115, 130, 135)


# ---------------------------------------------------------------- user catalog files


def _new_gpu() -> dict[str, Any]:
    data = CATALOG.gpus["L40S"].model_dump(mode="json", exclude_none=True)
    data.update(
        name="Test-GPU-48GB",
        memory_gb=48,
        tdp_w=300,
        power_limit_max_w=300,
        sources={"tdp_w": "test"},
    )
    return data


def _h100_override() -> dict[str, Any]:
    data = CATALOG.gpus["H100-SXM5-80GB"].model_dump(mode="json", exclude_none=True)
    data.update(tdp_w=650, power_limit_max_w=650, sources={"tdp_w": "site power policy"})
    return data


def _new_model() -> dict[str, Any]:
    data = CATALOG.models["Llama-3.1-8B"].model_dump(mode="json", exclude_none=True)
    data.update(name="Tiny-8B-FP8", bytes_per_param=1, sources={"bytes_per_param": "FP8"})
    return data


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
        )
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def write_catalog(path: Path, data: dict[str, Any]) -> Path:
    """Write a catalog file in the format its suffix names (TOML as arrays of tables)."""
    if path.suffix == ".json":
        path.write_text(json.dumps(data), encoding="utf-8")
    elif path.suffix == ".toml":
        lines = []
        for key, entries in data.items():
            for entry in entries:
                lines.append(f"[[{key}]]")
                lines.extend(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in entry.items())
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def write_instance(path: Path, catalog: list[str], gpu_type: str, model: str) -> Path:
    data = yaml.safe_load(QUICKSTART.read_text(encoding="utf-8"))
    data["catalog"] = catalog
    data["cluster"]["nodes"].append(
        {"name": "n1", "gpus": [{"type": gpu_type, "count": 2}], "power_budget_w": 600}
    )
    data["workloads"][0]["model"] = model
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.parametrize("suffix", [".yaml", ".json", ".toml"])
def test_user_catalog_adds_and_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    folder = tmp_path / "site"
    (folder / "cats").mkdir(parents=True)
    write_catalog(
        folder / "cats" / f"extra{suffix}",
        {"gpus": [_new_gpu(), _h100_override()], "models": [_new_model()]},
    )
    inst = write_instance(
        folder / "inst.yaml", [f"cats/extra{suffix}"], "Test-GPU-48GB", "Tiny-8B-FP8"
    )
    monkeypatch.chdir(tmp_path)  # relative catalog paths are relative to the instance file

    problem = load_problem(inst)

    assert problem.gpu_type("Test-GPU-48GB").memory_gb == 48
    assert problem.gpu_type("H100-SXM5-80GB").tdp_w == 650
    assert problem.gpu_type("H100-SXM5-80GB").sources == {"tdp_w": "site power policy"}
    assert problem.model_of(problem.instance.workloads[0]).bytes_per_param == 1
    assert problem.gpu_types_used() == ["H100-SXM5-80GB", "Test-GPU-48GB"]
    assert [g.type for g in problem.gpus].count("Test-GPU-48GB") == 2
    # built-in entries not named in the file are still there
    assert problem.gpu_type("L4") == CATALOG.gpus["L4"]
    # and the embedded catalog itself is untouched
    assert builtin_catalog().gpus["H100-SXM5-80GB"].tdp_w == 700
    assert "Test-GPU-48GB" not in builtin_catalog().gpus


def test_without_the_user_catalog_the_new_names_are_unknown(tmp_path: Path) -> None:
    inst = write_instance(tmp_path / "inst.yaml", [], "Test-GPU-48GB", "Tiny-8B-FP8")
    with pytest.raises(SpecError) as info:
        load_problem(inst)
    text = str(info.value)
    assert f"{inst}: cluster.nodes[1](n1).gpus[0].type: unknown GPU type 'Test-GPU-48GB'" in text
    assert f"{inst}: workloads[0](chat).model: unknown model 'Tiny-8B-FP8'" in text


def test_inline_gpu_types_override_builtin(tmp_path: Path) -> None:
    data = yaml.safe_load(QUICKSTART.read_text(encoding="utf-8"))
    data["gpu_types"] = [_h100_override()]
    path = tmp_path / "inline.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert load_problem(path).gpu_type("H100-SXM5-80GB").tdp_w == 650
    assert load_problem(QUICKSTART).gpu_type("H100-SXM5-80GB").tdp_w == 700


def test_load_catalog_file_returns_entries(tmp_path: Path) -> None:
    path = write_catalog(tmp_path / "c.yaml", {"gpus": [_new_gpu()]})
    gpus, models = load_catalog_file(path)
    assert [g.name for g in gpus] == ["Test-GPU-48GB"]
    assert models == []


def test_bad_catalog_entries_name_file_and_index(tmp_path: Path) -> None:
    bad_gpu = {**_new_gpu(), "idle_w": 400}  # above its TDP
    bad_model = {**_new_model(), "layers": -1}
    del bad_model["vocab_size"]
    path = write_catalog(
        tmp_path / "broken.yaml",
        {
            "gpus": [_new_gpu(), bad_gpu, "not a mapping", {**_new_gpu(), "sm_count": "many"}],
            "models": [bad_model],
        },
    )
    with pytest.raises(SpecError) as info:
        load_catalog_file(path)
    lines = info.value.problems
    assert all(line.startswith(f"{path}: ") for line in lines), lines
    fields = sorted(line.removeprefix(f"{path}: ").split(": ")[0] for line in lines)
    assert fields == [
        "gpus[1]",
        "gpus[2]",
        "gpus[3].sm_count",
        "models[0].layers",
        "models[0].vocab_size",
    ]
    assert any("gpus[1]: " in line and "idle_w must be below tdp_w" in line for line in lines)
    assert "(top level)" not in str(info.value)


def test_bad_catalog_is_reported_through_the_instance(tmp_path: Path) -> None:
    catalog = write_catalog(
        tmp_path / "cat.json", {"gpus": [{**_new_gpu(), "tdp_w": -5}], "models": []}
    )
    inst = write_instance(tmp_path / "inst.yaml", ["cat.json"], "Test-GPU-48GB", "Llama-3.1-8B")
    with pytest.raises(SpecError) as info:
        load_problem(inst)
    assert f"{inst}: catalog[0]: {catalog}: gpus[0].tdp_w: Input should be greater than 0" in (
        info.value.problems
    )


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ({"gpu": [_new_gpu()]}, "gpu: unknown key (expected gpus, models)"),
        ({"gpus": {"name": "x"}}, "gpus: must be a list"),
        ({"models": "Llama"}, "models: must be a list"),
    ],
    ids=["typo-key", "gpus-mapping", "models-string"],
)
def test_malformed_catalog_layout(tmp_path: Path, content: dict[str, Any], words: str) -> None:
    path = write_catalog(tmp_path / "cat.yaml", content)
    with pytest.raises(SpecError) as info:
        load_catalog_file(path)
    assert f"{path}: {words}" in info.value.problems


def test_missing_catalog_file_is_named(tmp_path: Path) -> None:
    inst = write_instance(tmp_path / "inst.yaml", ["nowhere.yaml"], "L4", "Llama-3.1-8B")
    with pytest.raises(SpecError) as info:
        load_problem(inst)
    line = info.value.problems[0]
    assert line.startswith(f"{inst}: catalog[0]: {tmp_path / 'nowhere.yaml'}: cannot read")
