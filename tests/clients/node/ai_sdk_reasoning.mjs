// The AI SDK's OpenResponses provider with a reasoning upstream (scripted by
// tests/e2e/clients.rs: a stream with reasoning "Let me think." then text "Hi there.", then the
// same as one JSON completion): reasoning parts and text, streamed and not.
import assert from 'node:assert/strict';
import { createOpenResponses } from '@ai-sdk/open-responses';
import { generateText, streamText } from 'ai';
import { BASE_URL, MODEL, main } from './_common.mjs';

const REASONING = 'Let me think.';
const TEXT = 'Hi there.';

await main(async () => {
  const model = createOpenResponses({ name: 'responses-extproc', url: `${BASE_URL}/responses` })(MODEL);

  const stream = streamText({ model, prompt: 'hi' });
  const reasoning = [];
  const text = [];
  for await (const part of stream.fullStream) {
    if (part.type === 'error') throw part.error;
    if (part.type === 'reasoning-delta') reasoning.push(part.text);
    if (part.type === 'text-delta') text.push(part.text);
  }
  assert.equal(reasoning.join(''), REASONING, `streamText: reasoning deltas (${JSON.stringify(reasoning)})`);
  assert.equal(text.join(''), TEXT, 'streamText: text');
  assert.equal(await stream.reasoningText, REASONING, 'streamText: reasoningText');

  const result = await generateText({ model, prompt: 'hi' });
  assert.equal(result.reasoningText, REASONING, 'generateText: reasoningText');
  assert.equal(result.text, TEXT, 'generateText: text');
});
