// Lanes (`stream_id`) and steering (`response.steer`) with openai-node's WebSocket client,
// `ResponsesWS`, through Envoy: the same script and scripted upstream as
// tests/clients/python/openai_websocket_lanes.py (see there for the replies, in order):
// two lanes side by side, FIFO on one lane, a fork across lanes, every event's `stream_id`, a
// steer's automatic successor, a steer pending on a tool call then the explicit continuation,
// and the failures `response_not_found`, `invalid_input`, `response_already_completed`.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { ResponsesWS } from 'openai/resources/responses/ws';
import { MODEL, main } from './_common.mjs';

const TERMINAL = new Set(['response.completed', 'response.failed', 'response.incomplete']);
const LOOKUP = { type: 'function', name: 'lookup', parameters: { type: 'object', properties: {} } };

// Lets the scripted upstream's next held reply go on.
async function release() {
  const answer = await fetch(`${process.env.SCRIPTED_UPSTREAM_URL}/__release`, { method: 'POST' });
  assert.equal(answer.status, 204, 'release a held reply');
}

await main(async () => {
  const client = new OpenAI({ maxRetries: 0, timeout: 30_000 });
  const ws = new ResponsesWS(client);
  const messages = ws.stream();
  const seen = new Map();

  // The next server event, whatever its lane.
  const next = async () => {
    for (;;) {
      const { value, done } = await messages.next();
      assert.ok(!done, 'the connection ended');
      if (value.type === 'message') return value.message;
      assert.notEqual(value.type, 'error', `a socket error: ${value.error?.message}`);
    }
  };
  // The next event of `lane`; events of other lanes wait in `seen`.
  const nextOn = async (lane) => {
    const waiting = seen.get(lane);
    if (waiting?.length) return waiting.shift();
    for (;;) {
      const event = await next();
      assert.ok(event.stream_id, `every event of a lane names it: ${event.type}`);
      if (event.stream_id === lane) return event;
      if (!seen.has(event.stream_id)) seen.set(event.stream_id, []);
      seen.get(event.stream_id).push(event);
    }
  };
  const responseOn = async (lane, what, first) => {
    const events = first ? [first] : [];
    while (!events.length || !TERMINAL.has(events.at(-1).type)) {
      const event = await nextOn(lane);
      assert.notEqual(event.type, 'error', `${what}: ${JSON.stringify(event)}`);
      events.push(event);
    }
    return events;
  };
  const completed = (events, what, text) => {
    const last = events.at(-1);
    assert.deepEqual([last.type, last.response.status], ['response.completed', 'completed'], `${what}: terminal`);
    const said = last.response.output.flatMap((o) => o.content ?? []).map((p) => p.text).join('');
    assert.equal(said, text, `${what}: text`);
    return last.response;
  };
  const steerFailed = async (what, code, input) => {
    const event = await next();
    assert.equal(event.type, 'response.steer.failed', `${what}: event`);
    assert.equal(event.error.code, code, `${what}: code`);
    assert.deepEqual(event.steer.input, input, `${what}: the input given back`);
  };
  const create = (body) => ws.send({ type: 'response.create', model: MODEL, store: false, ...body });
  const steer = (input, previous_response_id) => ws.send({ type: 'response.steer', input, previous_response_id });

  // Two lanes side by side: lane a is held upstream while lane b runs to its end.
  create({ input: 'slow', stream_id: 'a' });
  const createdA = await nextOn('a');
  assert.equal(createdA.type, 'response.created', 'lane a: created');
  create({ input: 'fast', stream_id: 'b' });
  const b = completed(await responseOn('b', 'lane b'), 'lane b', 'B');
  await release();
  const a = completed(await responseOn('a', 'lane a', createdA), 'lane a', 'A');
  assert.notEqual(a.id, b.id);

  // One lane is FIFO.
  create({ input: 'first', stream_id: 'c' });
  create({ input: 'second', stream_id: 'c' });
  completed(await responseOn('c', 'lane c, first'), 'lane c, first', 'one');
  const two = completed(await responseOn('c', 'lane c, second'), 'lane c, second', 'two');

  // A lane continues a response of another.
  create({ input: 'and?', stream_id: 'd', previous_response_id: a.id });
  const forked = completed(await responseOn('d', 'fork'), 'fork', 'forked');
  assert.equal(forked.previous_response_id, a.id, 'fork: previous_response_id');

  // A steer during a streamed answer.
  create({ input: 'Write about roses.', stream_id: 's', instructions: 'Be brief.' });
  const created = await nextOn('s');
  assert.equal(created.type, 'response.created', 'steered: created');
  steer('Also mention the sea.', created.response.id);
  let accepted = await nextOn('s');
  while (accepted.type !== 'response.steer.accepted') accepted = await nextOn('s');
  assert.equal(accepted.steer.previous_response_id, created.response.id, 'accepted: its target');
  await release();
  const first = completed(await responseOn('s', 'steered'), 'steered', 'Roses.');
  const successor = await responseOn('s', 'successor');
  assert.equal(successor[0].type, 'response.created', 'successor: created');
  const second = completed(successor, 'successor', 'And the sea.');
  assert.equal(second.previous_response_id, first.id, 'successor: continues the steered response');

  // A steer of a response that stops for the client's tool output.
  create({ input: 'Look it up.', stream_id: 't', tools: [LOOKUP] });
  const calling = await nextOn('t');
  steer([{ type: 'message', role: 'user', content: 'In French, please.' }], calling.response.id);
  accepted = await nextOn('t');
  while (accepted.type !== 'response.steer.accepted') accepted = await nextOn('t');
  await release();
  const called = await responseOn('t', 'tool call');
  assert.equal(called.at(-1).type, 'response.completed', 'tool call: completed');
  const pending = await nextOn('t');
  assert.equal(pending.type, 'response.steer.pending', 'pending after completed');
  assert.equal(pending.steer.id, accepted.steer.id, 'pending: the accepted steer');
  assert.deepEqual(pending.required_input, [{ type: 'function_call_output', call_id: 'call_1', name: 'lookup' }]);
  create({
    stream_id: 't', tools: [LOOKUP], previous_response_id: called.at(-1).response.id,
    input: [{ type: 'function_call_output', call_id: 'call_1', output: '42' }],
  });
  completed(await responseOn('t', 'continuation'), 'continuation', 'Quarante-deux.');
  assert.equal(seen.size === 0 || [...seen.values()].every((v) => !v.length), true, 'no event left unread');

  // What cannot steer.
  steer('x', 'resp_missing');
  await steerFailed('unknown response', 'response_not_found', 'x');
  const bad = [{ type: 'message', role: 'assistant', content: 'x' }];
  steer(bad, a.id);
  await steerFailed('assistant input', 'invalid_input', bad);
  steer('late', two.id);
  await steerFailed('ended response', 'response_already_completed', 'late');
  ws.close({ code: 1000, reason: 'done' });
});
