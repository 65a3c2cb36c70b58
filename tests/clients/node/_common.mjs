// Shared helpers of the Node client scripts (run by tests/e2e_clients.rs).
//
// Every script talks to Envoy at $OPENAI_BASE_URL (the processor in front of the built-in demo
// upstream, src/demo.rs) and exits non-zero on the first mismatch. The demo is deterministic:
// text "Hello! This is the demo upstream. You said: <input>"; with tools and a user message
// last, one call "call_demo_1" of the first tool with every required string argument set to
// "San Francisco, CA"; after a tool result R, "The tool returned: R". Tokens are words.
import assert from 'node:assert/strict';

export const BASE_URL = process.env.OPENAI_BASE_URL ?? '';
export const MODEL = 'demo-model';
export const GREETING = 'Hello! This is the demo upstream. You said: ';
export const TOOL_CALL_ID = 'call_demo_1';
export const ARGUMENTS = '{"location":"San Francisco, CA"}';
// The demo streams tool-call arguments in fragments of 8 characters.
export const ARGUMENT_DELTAS = Math.ceil(ARGUMENTS.length / 8);
export const TOOL_RESULT = 'sunny, 21 C';
export const TOOL_ANSWER = `The tool returned: ${TOOL_RESULT}`;

export const WEATHER_TOOL = {
  type: 'function',
  name: 'get_weather',
  description: 'The current weather at a location.',
  parameters: {
    type: 'object',
    properties: { location: { type: 'string', description: 'City and region' } },
    required: ['location'],
    additionalProperties: false,
  },
  strict: true,
};

export const words = (text) => text.split(/\s+/).filter(Boolean).length;

export function textEvents(nWords) {
  return [
    'response.created',
    'response.in_progress',
    'response.output_item.added',
    'response.content_part.added',
    ...Array(nWords).fill('response.output_text.delta'),
    'response.output_text.done',
    'response.content_part.done',
    'response.output_item.done',
    'response.completed',
  ];
}

export function callEvents(nDeltas) {
  return [
    'response.created',
    'response.in_progress',
    'response.output_item.added',
    ...Array(nDeltas).fill('response.function_call_arguments.delta'),
    'response.function_call_arguments.done',
    'response.output_item.done',
    'response.completed',
  ];
}

export function checkResponse(resp, what) {
  assert.equal(resp.object, 'response', `${what}: object`);
  assert.match(resp.id, /^resp_/, `${what}: id`);
  assert.equal(typeof resp.created_at, 'number', `${what}: created_at`);
  assert.ok(Array.isArray(resp.output), `${what}: output`);
  assert.equal(resp.store, false, `${what}: store`);
}

export function checkWeatherCall(item, what) {
  assert.equal(item.type, 'function_call', `${what}: item type`);
  assert.equal(item.name, 'get_weather', `${what}: name`);
  assert.equal(item.call_id, TOOL_CALL_ID, `${what}: call_id`);
  assert.equal(item.arguments, ARGUMENTS, `${what}: arguments`);
  assert.equal(item.status, 'completed', `${what}: status`);
  assert.match(item.id, /^fc_/, `${what}: id`);
}

// Collects a stream's events, checking sequence numbers and that the deltas add up to the
// done events and the terminal response's output equals the output_item.done items.
export async function collect(stream, what) {
  const events = [];
  for await (const event of stream) {
    assert.equal(typeof event.type, 'string', `${what}: event #${events.length} type`);
    assert.equal(event.sequence_number, events.length, `${what}: event #${events.length} (${event.type}) sequence_number`);
    events.push(event);
  }
  const terminal = events.at(-1).response;
  checkResponse(terminal, `${what}: terminal response`);
  assert.deepEqual(
    terminal.output,
    events.filter((e) => e.type === 'response.output_item.done').map((e) => e.item),
    `${what}: terminal output == output_item.done items`,
  );
  const ids = new Set(events.filter((e) => e.response).map((e) => e.response.id));
  assert.equal(ids.size, 1, `${what}: one response id`);
  const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  for (const e of events.filter((e) => e.type === 'response.output_text.done')) {
    assert.equal(e.text, text, `${what}: output_text.done == deltas`);
  }
  const args = events.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
  for (const e of events.filter((e) => e.type === 'response.function_call_arguments.done')) {
    assert.equal(e.arguments, args, `${what}: function_call_arguments.done == deltas`);
  }
  return { types: events.map((e) => e.type), events, terminal, text };
}

export async function main(run) {
  try {
    assert.match(BASE_URL, /^http:\/\//, 'OPENAI_BASE_URL must be set (http://127.0.0.1:<port>/v1)');
    await run();
  } catch (e) {
    console.log(`FAIL: ${e?.stack ?? e}`);
    process.exit(1);
  }
  console.log('ok');
}
