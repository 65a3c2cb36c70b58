// The AI SDK (`ai` with its OpenResponses provider, `@ai-sdk/open-responses`) against the demo
// upstream through Envoy: generateText and streamText, plain and with a tool the SDK runs
// itself (two steps: the call, then the answer from its result).
import assert from 'node:assert/strict';
import { createOpenResponses } from '@ai-sdk/open-responses';
import { generateText, streamText, stepCountIs, tool } from 'ai';
import { z } from 'zod';
import { BASE_URL, GREETING, MODEL, TOOL_ANSWER, TOOL_RESULT, main } from './_common.mjs';

await main(async () => {
  const provider = createOpenResponses({ name: 'responses-extproc', url: `${BASE_URL}/responses` });
  const model = provider(MODEL);

  // generateText
  let result = await generateText({ model, prompt: 'hi' });
  assert.equal(result.text, GREETING + 'hi', 'generateText: text');
  assert.equal(result.finishReason, 'stop', 'generateText: finish reason');
  assert.ok(result.usage.outputTokens > 0, 'generateText: usage');

  // streamText
  let stream = streamText({ model, prompt: 'hello there' });
  let deltas = [];
  for await (const part of stream.textStream) deltas.push(part);
  assert.ok(deltas.length > 1, `streamText: streamed in pieces (${deltas.length})`);
  assert.equal(deltas.join(''), GREETING + 'hello there', 'streamText: text');
  assert.equal(await stream.finishReason, 'stop', 'streamText: finish reason');

  // A tool the SDK runs: the demo calls it, then answers from its result.
  const seen = [];
  const tools = {
    get_weather: tool({
      description: 'The current weather at a location.',
      inputSchema: z.object({ location: z.string().describe('City and region') }),
      execute: async ({ location }) => {
        seen.push(location);
        return TOOL_RESULT;
      },
    }),
  };
  result = await generateText({ model, prompt: 'weather in Paris?', tools, stopWhen: stepCountIs(3) });
  assert.deepEqual(seen, ['San Francisco, CA'], 'generateText + tool: the tool ran once with the arguments');
  assert.equal(result.steps.length, 2, 'generateText + tool: two steps');
  assert.equal(result.steps[0].toolCalls[0].toolName, 'get_weather', 'generateText + tool: call');
  assert.equal(result.text, TOOL_ANSWER, 'generateText + tool: answer');

  stream = streamText({ model, prompt: 'weather in Paris?', tools, stopWhen: stepCountIs(3) });
  const types = new Set();
  for await (const part of stream.fullStream) {
    if (part.type === 'error') throw part.error;
    types.add(part.type);
  }
  // (The provider announces a call whole, at its output_item.done: no tool-input-* parts.)
  for (const t of ['tool-call', 'tool-result', 'text-delta', 'finish']) {
    assert.ok(types.has(t), `streamText + tool: a ${t} part (saw ${[...types].join(', ')})`);
  }
  assert.equal((await stream.steps).length, 2, 'streamText + tool: two steps');
  assert.deepEqual(seen, ['San Francisco, CA', 'San Francisco, CA'], 'streamText + tool: the tool ran');
  assert.equal(await stream.text, TOOL_ANSWER, 'streamText + tool: answer');
});
