"""Run SpecForge's scripts/prepare_hidden_states.py with the toy chat template registered.

Workaround W1 (data only): SpecForge's loss mask is found by regex on its own
ChatTemplate (specforge/data/template.py, TEMPLATE_REGISTRY; used by
specforge/data/parse.py GeneralParser.set_assistant_pattern). None of the built-in
templates matches the toy target's character-level chat template
(fixtures/toy-pair/target/chat_template.jinja), so register one whose markers are
the toy template's: 'user: ' / 'bot: ' / ' end '. This is the registration route
the TemplateRegistry docstring itself documents.
"""
import os, runpy, sys
from specforge.data.template import TEMPLATE_REGISTRY, ChatTemplate

TEMPLATE_REGISTRY.register(
    name="toy",
    template=ChatTemplate(
        assistant_header="bot: ",
        user_header="user: ",
        system_prompt=None,
        end_of_turn_token=" end ",
    ),
)
if os.environ.get("SF_CPU_PATCH") == "1":
    import cpu_patch  # noqa: F401  (W2..Wn, see cpu_patch.py)
script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", os.environ.get("SF_SCRIPT", "prepare_hidden_states.py"))
sys.argv = [script] + sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
runpy.run_path(script, run_name="__main__")
