"""omrl's built-in action templates: react, xml and tool_call.

Each one writes the system instructions for an env, parses a reply into an
action (never raising), and writes an action as a well-formatted reply
(``format_action``, used for the prompt's example and for expert demonstrations).
"""

from omrl.hookspecs import hookimpl
from omrl_plugins.templates.react import ReactTemplate
from omrl_plugins.templates.tool_call import ToolCallTemplate
from omrl_plugins.templates.xml_tags import XmlTemplate

TEMPLATES = {"react": ReactTemplate, "xml": XmlTemplate, "tool_call": ToolCallTemplate}


@hookimpl
def register_templates(register):
    for name, template_class in TEMPLATES.items():
        register(name, template_class)
