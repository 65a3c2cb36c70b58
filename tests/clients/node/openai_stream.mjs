// The official `openai` npm SDK, streaming: `responses.create({stream: true})` async iteration
// (exact event sequence, sequence numbers, deltas == done events == terminal response), the
// `responses.stream()` helper's finalResponse(), and a streamed stateless tool round trip.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import {
  ARGUMENT_DELTAS, GREETING, MODEL, TOOL_ANSWER, TOOL_RESULT, WEATHER_TOOL,
  callEvents, checkResponse, checkWeatherCall, collect, main, textEvents, words,
} from './_common.mjs';

await main(async () => {
  const client = new OpenAI({ maxRetries: 0, timeout: 30_000 });
  const text = GREETING + 'hi';

  // create({stream: true})
  let got = await collect(await client.responses.create({ model: MODEL, input: 'hi', stream: true }), 'create');
  assert.deepEqual(got.types, textEvents(words(text)), 'create: event types');
  assert.equal(got.text, text, 'create: text');
  assert.equal(got.terminal.status, 'completed', 'create: status');
  assert.deepEqual([got.terminal.usage.input_tokens, got.terminal.usage.output_tokens], [1, words(text)], 'create: usage');
  const created = got.events[0].response;
  assert.deepEqual([created.status, created.output, created.usage], ['in_progress', [], null], 'create: response.created');

  // The stream() helper.
  const helper = client.responses.stream({ model: MODEL, input: 'hi' });
  got = await collect(helper, 'helper');
  assert.deepEqual(got.types, textEvents(words(text)), 'helper: event types');
  const final = await helper.finalResponse();
  checkResponse(final, 'helper: final');
  assert.equal(final.output_text, text, 'helper: final output_text');

  // A streamed tool round trip, stateless.
  const question = { role: 'user', content: 'What is the weather in Paris?' };
  got = await collect(
    await client.responses.create({ model: MODEL, input: [question], tools: [WEATHER_TOOL], store: false, stream: true }),
    'tool call',
  );
  assert.deepEqual(got.types, callEvents(ARGUMENT_DELTAS), 'tool call: event types');
  const added = got.events[2].item;
  assert.deepEqual([added.type, added.status, added.arguments], ['function_call', 'in_progress', ''], 'tool call: item added');
  assert.equal(got.terminal.output.length, 1, 'tool call: one output item');
  const call = got.terminal.output[0];
  checkWeatherCall(call, 'tool call');

  got = await collect(
    await client.responses.create({
      model: MODEL,
      input: [question, call, { type: 'function_call_output', call_id: call.call_id, output: TOOL_RESULT }],
      tools: [WEATHER_TOOL],
      store: false,
      stream: true,
    }),
    'tool answer',
  );
  assert.deepEqual(got.types, textEvents(words(TOOL_ANSWER)), 'tool answer: event types');
  assert.equal(got.text, TOOL_ANSWER, 'tool answer: text');
  assert.equal(got.terminal.status, 'completed', 'tool answer: status');
});
