// The official `openai` npm SDK with a reasoning upstream (scripted by tests/e2e/clients.rs: a
// stream with reasoning "Let me think." then text "Hi there.", twice). The SDK has no runtime
// types, so each event's `type` is checked against the ResponseStreamEvent union of the SDK's
// own type declarations (node_modules/openai/resources/responses/responses.d.ts): every event
// is one the SDK declares, with the fields its interface requires; reasoning arrives as
// `response.reasoning_text.*` (the processor's default for OpenAI's SDKs).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import { MODEL, collect, main } from './_common.mjs';

/** `type` literal -> required field names, for each member of ResponseStreamEvent. */
function declaredEvents() {
  const dts = readFileSync(new URL('./node_modules/openai/resources/responses/responses.d.ts', import.meta.url), 'utf8');
  const union = dts.match(/export type ResponseStreamEvent = ([^;]+);/)[1].split('|').map((s) => s.trim());
  const events = new Map();
  for (const name of union) {
    const body = dts.match(new RegExp(`export interface ${name} \\{([\\s\\S]*?)\\n\\}`))[1];
    const type = body.match(/^\s+type: '([^']+)';/m)[1];
    const required = [...body.matchAll(/^    (\w+): /gm)].map((m) => m[1]);
    events.set(type, required);
  }
  return events;
}

const REASONING_EVENTS = [
  'response.created', 'response.in_progress',
  'response.output_item.added', 'response.content_part.added',
  'response.reasoning_text.delta', 'response.reasoning_text.delta', 'response.reasoning_text.done',
  'response.content_part.done', 'response.output_item.done',
  'response.output_item.added', 'response.content_part.added',
  'response.output_text.delta', 'response.output_text.delta', 'response.output_text.done',
  'response.content_part.done', 'response.output_item.done',
  'response.completed',
];

await main(async () => {
  const declared = declaredEvents();
  assert.ok(declared.size > 50, `the SDK declares its events (${declared.size})`);
  const client = new OpenAI({ maxRetries: 0, timeout: 30_000 });
  const check = (events, what) => {
    for (const [i, e] of events.entries()) {
      const required = declared.get(e.type);
      assert.ok(required, `${what}: event #${i} type ${e.type} is not in the SDK's ResponseStreamEvent`);
      for (const field of required) assert.ok(field in e, `${what}: event #${i} (${e.type}) lacks ${field}`);
    }
  };

  const got = await collect(await client.responses.create({ model: MODEL, input: 'hi', stream: true }), 'create');
  check(got.events, 'create');
  assert.deepEqual(got.types, REASONING_EVENTS, 'create: event types');
  const deltas = got.events.filter((e) => e.type === 'response.reasoning_text.delta').map((e) => e.delta);
  assert.equal(deltas.join(''), 'Let me think.', 'create: reasoning');
  assert.equal(got.terminal.output[0].content[0].text, 'Let me think.', 'create: reasoning item');

  const helper = client.responses.stream({ model: MODEL, input: 'hi' });
  const seen = [];
  for await (const e of helper) seen.push(e);
  check(seen, 'helper');
  const final = await helper.finalResponse();
  assert.deepEqual(final.output.map((o) => o.type), ['reasoning', 'message'], 'helper: output items');
  assert.equal(final.output_text, 'Hi there.', 'helper: output_text');
});
