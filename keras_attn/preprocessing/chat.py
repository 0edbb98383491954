"""Chat templates: a checkpoint's Jinja template turning conversations into the prompt text.

A Hugging Face checkpoint of an instruction-tuned model keeps its `chat_template` in
`tokenizer_config.json` (a string, or a list of named templates) or in a `chat_template.jinja`
file (which wins, as in transformers). `ChatTemplate.render` renders conversations exactly as
transformers' `tokenizer.apply_chat_template(conversation, tokenize=False,
add_generation_prompt=True)` does: the same sandboxed Jinja environment
(`ImmutableSandboxedEnvironment` with `trim_blocks`, `lstrip_blocks` and the `loopcontrols`
extension), the same globals (`raise_exception`, `strftime_now`, `namespace`, `dict`) and
`tojson` filter, and the tokenizer's special tokens (`bos_token`, `eos_token`, ...) as
variables. The rendered text is tokenized without the tokenizer's own template (transformers'
`add_special_tokens=False`): the chat template writes its special tokens itself.

A conversation is a list of messages, each a dict with a `"role"` (`"system"`, `"user"`,
`"assistant"`, ...) and usually a `"content"`; a batch is a list of conversations.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping

# The special tokens transformers gives a template as variables (its tokenizers'
# `SPECIAL_TOKENS_ATTRIBUTES`).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")
CHAT_TEMPLATE_FILE = "chat_template.jinja"


def is_conversation(inputs) -> bool:
    """Whether `inputs` is chat: a non-empty list of dicts (one conversation) or a non-empty
    list of such lists (a batch). Only the first element is looked at; `as_conversations`
    checks the rest."""
    if not isinstance(inputs, (list, tuple)) or not inputs:
        return False
    first = inputs[0]
    if isinstance(first, (list, tuple)):
        return bool(first) and isinstance(first[0], Mapping)
    return isinstance(first, Mapping)


def as_conversations(name: str, inputs) -> tuple[list[list[dict]], bool]:
    """`inputs` (one conversation or a batch of them) as `(conversations, single)`: plain
    dicts, keys whose value is None dropped (as transformers drops them). A message that is not
    a dict, has no str `"role"`, or an empty conversation is a ValueError naming `name`."""
    single = bool(inputs) and isinstance(inputs, (list, tuple)) and isinstance(inputs[0],
                                                                               Mapping)
    batch = [inputs] if single else inputs
    if not isinstance(batch, (list, tuple)) or not batch:
        raise ValueError(f"Argument `{name}` must be a conversation (a list of messages, each "
                         "a dict with a 'role' and a 'content') or a list of conversations. "
                         f"Received: {name}={inputs!r:.200}")
    conversations = []
    for i, conversation in enumerate(batch):
        if not isinstance(conversation, (list, tuple)) or not conversation:
            raise ValueError(f"Argument `{name}` must be a list of conversations, each a "
                             f"non-empty list of messages. Received: {name}[{i}]="
                             f"{conversation!r:.200}")
        messages = []
        for j, message in enumerate(conversation):
            where = f"{name}[{j}]" if single else f"{name}[{i}][{j}]"
            if not isinstance(message, Mapping):
                raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
                    f"Argument `{name}`: every message must be a dict with a 'role' and a "
                    f"'content'. Received: {where}={message!r:.200}")
            if not isinstance(message.get("role"), str):
                raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
                    f"Argument `{name}`: every message must have a 'role' (a str: 'system', "
                    f"'user', 'assistant', ...). Received: {where}={message!r:.200}")
            messages.append({key: _plain(value) for key, value in message.items()
                             if value is not None})
        conversations.append(messages)
    return conversations, single


def _plain(value):
    """`value` rebuilt from plain JSON types (what transformers hands a template): str, int,
    float, bool, None, dicts, lists and tuples; anything else becomes `"<TypeName>"`."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if hasattr(value, "item") and callable(value.item):  # NumPy scalars
        return _plain(value.item())
    return f"<{type(value).__name__}>"


class ChatTemplate:
    """A chat template and the special tokens it reads, rendering as transformers does.

    Args:
        template: str, the Jinja source (`tokenizer_config.json`'s `chat_template`).
        special_tokens: optional dict from `"bos_token"`, `"eos_token"`, ... to the token's
            text, the template's variables. Defaults to `None` (none).

    Example:
    >>> chat = ChatTemplate("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
    ...                     "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    >>> chat.render([{"role": "user", "content": "Hi"}])  # ["<user>Hi<assistant>"]
    """

    def __init__(self, template: str, special_tokens: dict | None = None):
        if not isinstance(template, str) or not template:
            raise ValueError("Received an invalid value for argument `template`, expected the "
                             f"Jinja source of a chat template. Received: template={template!r:.200}")
        self.template = template
        self.special_tokens = {key: str(value) for key, value in (special_tokens or {}).items()
                               if value is not None}
        self._compiled = None

    def _jinja(self):
        if self._compiled is None:
            self._compiled = _environment().from_string(self.template)
        return self._compiled

    def render(self, conversations, add_generation_prompt: bool = True, **variables
               ) -> list[str]:
        """The prompt text of each conversation.

        Args:
            conversations: a conversation (a list of message dicts) or a list of them.
            add_generation_prompt: bool, end with the header of the assistant's turn (what
                generation continues from). Defaults to `True`.
            **variables: more template variables (e.g. `date_string`), overriding the
                special tokens.

        Returns:
            list of str, one per conversation.

        Raises:
            ValueError: a malformed message (named `inputs`), or the template refused the
                conversation (its `raise_exception` message).
        """
        import jinja2

        conversations, _ = as_conversations("inputs", conversations)
        compiled = self._jinja()
        values = _plain({**self.special_tokens, **variables})
        texts = []
        for messages in conversations:
            try:
                texts.append(compiled.render(messages=messages, tools=None, documents=None,
                                             add_generation_prompt=bool(add_generation_prompt),
                                             **values))
            except jinja2.exceptions.TemplateError as error:
                raise ValueError(f"The chat template refused argument `inputs`: {error}") \
                    from error
        return texts

    def get_config(self) -> dict:
        return {"template": self.template, "special_tokens": dict(self.special_tokens)}


def _environment():
    """transformers' Jinja environment for chat templates (`chat_template_utils`)."""
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError as error:  # pragma: no cover - a dependency of the checkpoints extra
        raise ImportError("Chat templates need jinja2>=3.1.6: pip install jinja2") from error

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own `tojson` escapes HTML characters; transformers' does not.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    class TemplateDict:
        """`dict(...)` without the class's attributes (no escape from the sandbox)."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        """Jinja's namespace refusing underscore attributes (CPython internals)."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore attributes: {name!r}.")

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask marker):
        renders its body."""

        tags = frozenset({"generation"})

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno)

        def _body(self, caller):
            return caller()

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[Generation, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals.update(raise_exception=raise_exception, strftime_now=strftime_now,
                               dict=TemplateDict(), namespace=TemplateNamespace)
    return environment


def read_chat_template(files: Mapping[str, bytes]) -> ChatTemplate | None:
    """The chat template of a checkpoint's tokenizer files (name -> content), or None.

    `chat_template.jinja` wins over `tokenizer_config.json`'s `chat_template`; a list of named
    templates gives the one named `"default"`. The special tokens are those of
    `tokenizer_config.json` (a token's `content` when it is an object), overridden by
    `special_tokens_map.json` when the config has no `added_tokens_decoder`, as transformers
    reads them."""
    config = _json(files, "tokenizer_config.json")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if "default" not in named:
            raise ValueError("Cannot read the chat template: tokenizer_config.json has several "
                             f"chat templates ({sorted(map(str, named))}) and none named "
                             "'default'.")
        template = named["default"]
    if CHAT_TEMPLATE_FILE in files:
        template = files[CHAT_TEMPLATE_FILE].decode("utf-8")
    if not template:
        return None
    if not isinstance(template, str):
        raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad files
            "Cannot read the chat template: tokenizer_config.json's chat_template must be a "
            f"str. Received: {type(template).__name__}")
    tokens = {name: _content(config.get(name)) for name in SPECIAL_TOKEN_NAMES}
    if "added_tokens_decoder" not in config:
        mapping = _json(files, "special_tokens_map.json")
        tokens.update({name: _content(mapping[name]) for name in SPECIAL_TOKEN_NAMES
                       if name in mapping})
    return ChatTemplate(template, tokens)


def _content(token):
    return token.get("content") if isinstance(token, Mapping) else token


def _json(files: Mapping[str, bytes], name: str) -> dict:
    if name not in files:
        return {}
    value = json.loads(files[name].decode("utf-8"))
    return value if isinstance(value, dict) else {}
