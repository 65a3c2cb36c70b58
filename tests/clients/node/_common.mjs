// Shared helpers of the Node client scripts (run by tests/e2e/clients.rs).
//
// Every script talks to Envoy at $OPENAI_BASE_URL (the processor in front of the built-in demo
// upstream, src/demo.rs) and exits non-zero on the first mismatch. The demo is deterministic:
// text "Hello! This is the demo upstream. You said: <input>"; with tools and a user message
// last, one call "call_demo_1" of the first tool with every required string argument set to
// "San Francisco, CA"; after a tool result R, "The tool returned: R". Tokens are words.
import assert from 'node:assert/strict';
import WebSocket from 'ws';

// ---- every body and event is read for duplicate keys ----
//
// A JSON object with a key twice is valid to JSON.parse (the last one wins) but fails strict
// readers. Every response body (JSON), SSE event and WebSocket message a script receives is
// also read by `checkNoDuplicateKeys`: `fetch` (which the SDK uses) is wrapped to read a copy
// of each body as it arrives, and so is every `ws` socket's message event. Problems are kept in
// DUPLICATE_KEYS and fail the script in `main`.
export const DUPLICATE_KEYS = [];

// Throws on a key given twice in one object of `text` (a JSON text); returns nothing.
export function checkNoDuplicateKeys(text) {
  let i = 0;
  const ws = () => {
    while (i < text.length && ' \t\n\r'.includes(text[i])) i++;
  };
  const string = () => {
    const start = i++;
    while (text[i] !== '"') i += text[i] === '\\' ? 2 : 1;
    i++;
    return JSON.parse(text.slice(start, i));
  };
  const value = () => {
    ws();
    const c = text[i];
    if (c === '{') {
      i++;
      const keys = new Set();
      ws();
      if (text[i] === '}') return void i++;
      for (;;) {
        ws();
        const key = string();
        if (keys.has(key)) throw new Error(`duplicate key ${JSON.stringify(key)}`);
        keys.add(key);
        ws();
        i++; // ':'
        value();
        ws();
        if (text[i++] === '}') return;
      }
    }
    if (c === '[') {
      i++;
      ws();
      if (text[i] === ']') return void i++;
      for (;;) {
        value();
        ws();
        if (text[i++] === ']') return;
      }
    }
    if (c === '"') return void string();
    while (i < text.length && !',]} \t\n\r'.includes(text[i])) i++;
  };
  JSON.parse(text); // well-formed first
  value();
}

function note(what, text) {
  try {
    checkNoDuplicateKeys(text);
  } catch (e) {
    DUPLICATE_KEYS.push(`${what}: ${e.message}: ${text.slice(0, 300)}`);
  }
}

async function readCopy(body, url, sse) {
  const decoder = new TextDecoder();
  let buf = '';
  for await (const chunk of body) {
    buf += decoder.decode(chunk, { stream: true });
    if (sse) {
      const lines = buf.split('\n');
      buf = lines.pop();
      for (const line of lines) {
        const data = line.startsWith('data:') ? line.slice(5).trim() : '';
        if (data && data !== '[DONE]') note(`SSE event of ${url}`, data);
      }
    }
  }
  if (!sse && buf.trim()) note(`body of ${url}`, buf);
}

const originalFetch = globalThis.fetch;
globalThis.fetch = async (input, init) => {
  const response = await originalFetch(input, init);
  const type = response.headers.get('content-type') ?? '';
  const sse = type.includes('event-stream');
  if (!response.body || !(sse || type.includes('json'))) return response;
  const [mine, theirs] = response.body.tee();
  const url = typeof input === 'string' ? input : input.url ?? String(input);
  readCopy(mine, url, sse).catch((e) => DUPLICATE_KEYS.push(`reading ${url}: ${e}`));
  return new Response(theirs, { status: response.status, statusText: response.statusText, headers: response.headers });
};

const originalEmit = WebSocket.prototype.emit;
WebSocket.prototype.emit = function emit(event, ...args) {
  if (event === 'message') note('WebSocket message', args[0].toString());
  return originalEmit.call(this, event, ...args);
};

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
    process.exitCode = 1;
  }
  if (DUPLICATE_KEYS.length) {
    console.log(`FAIL: ${DUPLICATE_KEYS.length} bodies or events with a duplicate key, e.g. ${DUPLICATE_KEYS[0]}`);
    process.exitCode = 1;
  }
  if (process.exitCode) process.exit(1);
  console.log('ok');
}
