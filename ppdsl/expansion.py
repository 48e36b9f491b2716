"""A `use` line's generator, run: the pass above the syntax that makes a file's rows.

The parser reads a `use` line as data (`syntax.handoff.UseLine`); this module looks its name up
in `GENERATORS` (the registry's generators and the search, one table), runs it in a `Context`
(the header's sizes and mode, the file's costs line) within the file's bound on steps, and
tells every problem under the argument, name or header option it concerns. Here, not in the
parser, because the search reads costs and checks what it finds: the syntax stays below both.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import placement as placement_mod
from .diagnostics import Diagnostic, PpsError, sorted_unique
from .wording import plural
from .gcpause import no_gc
from .generators import registry
from .generators.registry import Context, GeneratorError, GeneratorSpec
from .ir import Generated, Program, SourceMap, Span
from .limits import steps_help
from .search import use as search_use
from .syntax.handoff import Unexpanded
from .syntax.parser import read

# Every generator a `use` line may name, in the order `ppdsl` lists them.
GENERATORS: Mapping[str, GeneratorSpec] = {**registry.REGISTRY, search_use.SPEC.name: search_use.SPEC}


def parse(text: str, path: str = "<input>", steps_limit: int | None = None, whole_runs: bool = True) -> Program:
    """Parse `.pps` text, running its `use` line's generator. Raises `PpsError` with located
    diagnostics on any problem; `steps_limit` and `whole_runs` as `syntax.parser.read`."""
    with no_gc():  # a generator's rows, like a file's, are many small objects
        read_ = read(text, path, steps_limit, whole_runs)
        return expand(read_) if isinstance(read_, Unexpanded) else read_


def _at(file: Unexpanded, span: Span, code: str, message: str, help: str | None = None) -> PpsError:
    """`code` under the whole of `span` (one column when its end is unknown), told with the
    errors noted while the file was read."""
    d = Diagnostic(code, message, file.path, span.line, span.column, span.end_column or span.column + 1, help=help)
    return PpsError(sorted_unique([*file.found, d]))


def _generator_error(file: Unexpanded, err: GeneratorError) -> PpsError:
    """A generator's problem, under the argument it names (else under the generator's name)."""
    use = file.use
    span = use.argument_spans.get(err.argument, use.name_span) if err.argument is not None else use.name_span
    return _at(file, span, err.code, err.message, err.help)


def _too_many(file: Unexpanded, count: int) -> PpsError:
    limit = file.limit_words or f"the limit of {file.steps_limit:,}"
    return _at(file, file.use.span, "PPS015", f"`{file.use.name}` makes {count:,} steps, more than {limit}",
               help=steps_help(count))


def expand(file: Unexpanded) -> Program:
    """The program `file`'s `use` line makes. Raises PpsError, located in the file."""
    use = file.use
    args = dict(use.arguments)
    context = Context(file.ranks, file.microbatches, file.mode == "inference", file.costs)
    try:
        spec = registry.lookup(use.name, GENERATORS)
        # Counted exactly before it is built: past the limit, nothing is made.
        count = registry.steps_of(spec, context, args)
        if count is not None and count > file.steps_limit:
            raise _too_many(file, count)
        built = registry.run(spec, context, args)
    except GeneratorError as err:
        raise _generator_error(file, err) from None
    stages, explicit, options = file.stages, file.placement, file.options
    if "stages" in options and stages != built.stages:
        raise _at(file, options["stages"], "PPS011",
                  f"`{use.name}` makes {plural(built.stages, 'stage')} but the header says stages={stages}")
    if file.placement_name is not None and "stages" not in options:
        # A named shape without `stages=` takes the generator's stage count.
        explicit = placement_mod.NAMED[file.placement_name](file.ranks, built.stages)
    if explicit is not None and explicit != built.placement:
        given = f"`placement={file.placement_name}`" if file.placement_name else "the header's placement"
        raise _at(file, options["placement"], "PPS011",
                  f"`{use.name}` places its {plural(built.stages, 'stage')} as {list(built.placement)}, "
                  f"not as {given} ({list(explicit)})",
                  help="drop `placement=` (the generator places its stages), or use a generator that makes this shape")
    made = sum(map(len, built.rows))
    if made > file.steps_limit:  # the search: counted once found
        raise _too_many(file, made)
    if file.found:
        raise PpsError(list(file.found))
    line = Span(use.span.line, use.span.column)
    source = SourceMap(file.path, file.text, file.header, tuple(line for _ in built.rows),
                       tuple(None for _ in built.rows), options, costs_line=file.costs_line, cost_spans=file.cost_spans)
    return Program(
        ranks=file.ranks,
        stages=built.stages,
        microbatches=file.microbatches,
        placement=built.placement,
        rows=built.rows,
        mode=file.mode,  # type: ignore[arg-type]
        memory_limit=file.memory,
        costs=file.costs,
        generated=Generated(registry.canonical_name(use.name), tuple(sorted(args.items()))),  # type: ignore[arg-type]
        source=source,
    )
