// The official `openai` npm SDK, non-streaming: `client.responses.create(...)`: text (output_text,
// status, usage), and a stateless function tool round trip (store: false); the stateless rules
// surface as a typed BadRequestError.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import {
  GREETING, MODEL, TOOL_ANSWER, TOOL_RESULT, WEATHER_TOOL,
  checkResponse, checkWeatherCall, main, words,
} from './_common.mjs';

await main(async () => {
  const client = new OpenAI({ maxRetries: 0, timeout: 30_000 });

  const text = GREETING + 'hi';
  const resp = await client.responses.create({ model: MODEL, input: 'hi' });
  checkResponse(resp, 'text');
  assert.equal(resp.output_text, text, 'text: output_text');
  assert.equal(resp.status, 'completed', 'text: status');
  assert.equal(resp.model, MODEL, 'text: model');
  assert.equal(resp.output.length, 1, 'text: one output item');
  const [msg] = resp.output;
  assert.deepEqual([msg.type, msg.role, msg.status], ['message', 'assistant', 'completed'], 'text: message');
  assert.deepEqual(msg.content.map((p) => p.type), ['output_text'], 'text: parts');
  assert.deepEqual(
    [resp.usage.input_tokens, resp.usage.output_tokens, resp.usage.total_tokens],
    [1, words(text), 1 + words(text)],
    'text: usage',
  );
  assert.equal(resp.usage.input_tokens_details.cached_tokens, 0, 'text: cached_tokens');
  assert.equal(resp.usage.output_tokens_details.reasoning_tokens, 0, 'text: reasoning_tokens');

  // A function tool round trip, stateless.
  const question = { role: 'user', content: 'What is the weather in Paris?' };
  const first = await client.responses.create({ model: MODEL, input: [question], tools: [WEATHER_TOOL], store: false });
  checkResponse(first, 'tool call');
  assert.equal(first.status, 'completed', 'tool call: status');
  assert.equal(first.output.length, 1, 'tool call: one output item');
  checkWeatherCall(first.output[0], 'tool call');
  assert.equal(first.output_text, '', 'tool call: no text');
  assert.deepEqual(first.tools.map((t) => t.name), ['get_weather'], 'tool call: tools echoed');

  const second = await client.responses.create({
    model: MODEL,
    input: [
      question,
      ...first.output,
      { type: 'function_call_output', call_id: first.output[0].call_id, output: TOOL_RESULT },
    ],
    tools: [WEATHER_TOOL],
    store: false,
  });
  checkResponse(second, 'tool answer');
  assert.equal(second.status, 'completed', 'tool answer: status');
  assert.equal(second.output_text, TOOL_ANSWER, 'tool answer: output_text');

  // Stateless: previous_response_id is a typed 400.
  await assert.rejects(
    client.responses.create({ model: MODEL, input: 'again', previous_response_id: first.id }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `previous_response_id: ${e}`);
      assert.equal(e.status, 400);
      assert.equal(e.code, 'previous_response_not_found');
      assert.equal(e.param, 'previous_response_id');
      return true;
    },
  );
});
