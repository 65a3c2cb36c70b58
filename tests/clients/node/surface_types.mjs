// The request surface of the installed openai-node: its create-response request type
// (`ResponseCreateParamsBase` and `stream`) as a small JSON type tree, read from the SDK's own
// .d.ts with the TypeScript compiler API (typescript pinned in package.json). Used by
// tests/surface/generate.py; prints the tree in the format tests/clients/python/surface_types.py
// documents. An argument names another openai package directory to read (default: the pinned
// one in node_modules), e.g. an older release unpacked with `npm pack`.
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const here = path.dirname(fileURLToPath(import.meta.url));
const pkg = path.resolve(process.argv[2] ?? path.join(here, 'node_modules/openai'));
const entry = path.join(pkg, 'resources/responses/responses.d.ts');

const program = ts.createProgram([entry], {
  strict: true,
  noEmit: true,
  skipLibCheck: true,
  target: ts.ScriptTarget.ES2022,
  module: ts.ModuleKind.NodeNext,
  moduleResolution: ts.ModuleResolutionKind.NodeNext,
});
const checker = program.getTypeChecker();
const source = program.getSourceFile(entry);
if (!source) throw new Error(`cannot read ${entry}`);

function findInterface(name) {
  let found;
  const visit = (n) => {
    if (found) return;
    if ((ts.isInterfaceDeclaration(n) || ts.isTypeAliasDeclaration(n)) && n.name.text === name) found = n;
    else ts.forEachChild(n, visit);
  };
  visit(source);
  if (!found) throw new Error(`no ${name} in ${entry}`);
  return checker.getTypeAtLocation(found.name);
}

const F = ts.TypeFlags;

function merge(members) {
  const out = [];
  for (const m of members) {
    for (const x of m.k === 'union' ? m.of : [m]) {
      const e = out.find((o) => o.k === 'enum');
      if (x.k === 'enum' && e) e.v.push(...x.v.filter((v) => !e.v.includes(v)));
      else if (!out.some((o) => JSON.stringify(o) === JSON.stringify(x))) out.push(x);
    }
  }
  // `true | false` is a boolean.
  const e = out.find((o) => o.k === 'enum');
  if (e && e.v.length === 2 && e.v.includes(true) && e.v.includes(false)) {
    out.splice(out.indexOf(e), 1, { k: 'bool' });
  }
  return out.length === 1 ? out[0] : { k: 'union', of: out };
}

function node(type, stack) {
  if (type.flags & (F.Any | F.Unknown)) return { k: 'any' };
  if (type.flags & F.Null) return { k: 'null' };
  if (type.flags & F.StringLiteral) return { k: 'enum', v: [type.value] };
  if (type.flags & F.NumberLiteral) return { k: 'enum', v: [type.value] };
  if (type.flags & F.BooleanLiteral) return { k: 'enum', v: [type.intrinsicName === 'true'] };
  if (type.flags & F.String) return { k: 'str' };
  if (type.flags & F.Number) return { k: 'num' };
  if (type.flags & F.Boolean) return { k: 'bool' };
  if (type.flags & F.Union) {
    return merge(type.types.filter((t) => !(t.flags & (F.Undefined | F.Void))).map((t) => node(t, stack)));
  }
  if (type.flags & F.Intersection) {
    // `string & {}` (an open string enum) is a string; otherwise the members' fields joined.
    if (type.types.some((t) => t.flags & F.String)) return { k: 'str' };
    const f = {};
    for (const t of type.types) Object.assign(f, node(t, stack).f ?? {});
    return { k: 'obj', f };
  }
  if (type.flags & F.Object) {
    if (checker.isArrayType(type) || checker.isTupleType(type)) {
      const [item] = checker.getTypeArguments(type);
      return { k: 'arr', of: item ? node(item, stack) : { k: 'any' } };
    }
    if (stack.includes(type)) return { k: 'any' };
    const props = checker.getPropertiesOfType(type);
    const index = checker.getIndexInfoOfType(type, ts.IndexKind.String);
    if (props.length === 0 && index) return { k: 'map', of: node(index.type, [...stack, type]) };
    if (props.length === 0) return { k: 'any' };
    const f = {};
    for (const p of props) {
      const decl = p.valueDeclaration ?? p.declarations?.[0];
      const t = checker.getTypeOfSymbolAtLocation(p, decl);
      f[p.name] = { t: node(t, [...stack, type]), req: !(p.flags & ts.SymbolFlags.Optional) };
    }
    return { k: 'obj', f };
  }
  throw new Error(`surface_types.mjs: no rule for ${checker.typeToString(type)}`);
}

const tree = node(findInterface('ResponseCreateParamsBase'), []);
tree.f.stream = { t: { k: 'union', of: [{ k: 'bool' }, { k: 'null' }] }, req: false };
console.log(JSON.stringify(tree));
