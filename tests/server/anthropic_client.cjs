// Drives a live offgraph server with the official `@anthropic-ai/sdk` npm package (pinned by
// scripts/npm-client.sh): Anthropic's own client, nobody here wrote it. Usage:
//   node anthropic_client.cjs NPM_DIR BASE_URL API_KEY MODEL
// Exits 0 when every check holds; prints each check and, on failure, what was seen.
'use strict';
const path = require('path');
const assert = require('assert/strict');

const [npmDir, base, key, model] = process.argv.slice(2);
const Anthropic = require(path.join(npmDir, 'node_modules', '@anthropic-ai', 'sdk'));
const client = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 120000 });
const wrongKey = new Anthropic({ baseURL: base, apiKey: key + 'x', maxRetries: 0 });

const weather = {
  name: 'get_weather',
  description: 'Weather of a city',
  input_schema: {
    type: 'object',
    // Enums: a greedy random model never ends a free string or number.
    properties: { city: { type: 'string', enum: ['Oslo', 'Paris'] },
      days: { type: 'integer', enum: [1, 2, 3] } },
    required: ['city', 'days'],
    additionalProperties: false,
  },
  strict: true, // the call's input is sampled under the schema
};
const ask = [{ role: 'user', content: 'What is the weather in Oslo?' }];

async function expectError(promise, status, type, says) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof Anthropic.APIError, `not an APIError: ${e}`);
    assert.equal(e.status, status, `status ${e.status}: ${e.message}`);
    assert.equal(e.error?.error?.type, type, JSON.stringify(e.error));
    if (says) assert.ok(e.message.includes(says), e.message);
    return;
  }
  assert.fail(`expected HTTP ${status}`);
}

let forced; // the forced call's message, answered in a later check

const checks = [
  ['without thinking asked for, no thinking blocks', async () => {
    const m = await client.messages.create({
      model, max_tokens: 24, temperature: 0, messages: [{ role: 'user', content: 'Say hello' }],
    });
    assert.ok(m.content.every((b) => b.type !== 'thinking'), JSON.stringify(m.content));
    const t = await client.messages.create({
      model, temperature: 0, thinking: { type: 'enabled', budget_tokens: 1024 },
      messages: [{ role: 'user', content: 'Say hello' }], max_tokens: 1030,
    }).catch((e) => e);
    // 1030 tokens do not fit beside the prompt in this server's context of 1024: the SDK gets the
    // error Claude Code lowers max_tokens on.
    assert.ok(t instanceof Anthropic.BadRequestError, String(t));
    assert.ok(t.message.includes('input length and `max_tokens` exceed context limit'), t.message);
  }],
  ['messages.create: a message with usage', async () => {
    const m = await client.messages.create({
      model, max_tokens: 24, temperature: 0, messages: [{ role: 'user', content: 'Say hello' }],
    });
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason), m.stop_reason);
    assert.ok(m.usage.input_tokens + m.usage.cache_read_input_tokens > 0);
    assert.ok(m.usage.output_tokens > 0);
  }],
  ['messages.stream accumulates what messages.create answers', async () => {
    const body = {
      model, max_tokens: 40, temperature: 0,
      system: [{ type: 'text', text: 'You are terse.', cache_control: { type: 'ephemeral' } }],
      messages: [{ role: 'user', content: 'Write a haiku about the sea' }],
    };
    const whole = await client.messages.create(body);
    const stream = client.messages.stream(body);
    let texts = 0;
    stream.on('text', () => { texts++; });
    const streamed = await stream.finalMessage();
    assert.deepEqual(streamed.content, whole.content);
    assert.equal(streamed.stop_reason, whole.stop_reason);
    assert.equal(streamed.usage.output_tokens, whole.usage.output_tokens);
    const textBlocks = whole.content.filter((b) => b.type === 'text');
    if (textBlocks.length) assert.ok(texts > 0, 'no text events for a text block');
  }],
  ['forced tool use: tool_use whose input validates', async () => {
    const m = await client.messages.create({
      model, max_tokens: 120, temperature: 0, messages: ask, tools: [weather],
      tool_choice: { type: 'tool', name: 'get_weather' }, thinking: { type: 'disabled' },
    });
    assert.equal(m.stop_reason, 'tool_use');
    const use = m.content.find((b) => b.type === 'tool_use');
    assert.ok(use, JSON.stringify(m.content));
    assert.equal(use.name, 'get_weather');
    assert.ok(['Oslo', 'Paris'].includes(use.input.city), JSON.stringify(use.input));
    assert.ok([1, 2, 3].includes(use.input.days), JSON.stringify(use.input));
    for (const k of Object.keys(use.input)) assert.ok(['city', 'days'].includes(k), k);
    forced = m;
  }],
  ['a tool_result turn is answered', async () => {
    const use = forced.content.find((b) => b.type === 'tool_use');
    const m = await client.messages.create({
      model, max_tokens: 16, temperature: 0, tools: [weather], thinking: { type: 'disabled' },
      messages: [...ask, { role: 'assistant', content: forced.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'Sunny, 21 C' }] }],
    });
    assert.equal(m.type, 'message');
    // The conversation up to the call was computed for the first request.
    assert.ok(m.usage.cache_read_input_tokens > 0, JSON.stringify(m.usage));
  }],
  ['countTokens equals the prompt the answer computed', async () => {
    const body = { model, messages: ask, tools: [weather], system: 'Be brief.' };
    const counted = await client.messages.countTokens(body);
    const m = await client.messages.create({ ...body, max_tokens: 2, temperature: 0 });
    assert.equal(counted.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
  }],
  ['stop_sequences end the answer with stop_sequence', async () => {
    const full = await client.messages.create({
      model, max_tokens: 40, temperature: 0, thinking: { type: 'adaptive' },
      messages: [{ role: 'user', content: 'Count to ten' }],
    });
    const said = full.content.map((b) => b.thinking ?? b.text ?? '').join('');
    assert.ok(said.length >= 12, JSON.stringify(full.content));
    const stop = said.slice(6, 10);
    const m = await client.messages.create({
      model, max_tokens: 40, temperature: 0, stop_sequences: [stop], thinking: { type: 'adaptive' },
      messages: [{ role: 'user', content: 'Count to ten' }],
    });
    assert.equal(m.stop_reason, 'stop_sequence');
    assert.equal(m.stop_sequence, stop);
  }],
  ['errors are Anthropic errors', async () => {
    await expectError(wrongKey.messages.create({ model, max_tokens: 4, messages: ask }), 401,
      'authentication_error');
    await expectError(client.messages.create({ model, max_tokens: 4, messages: [] }), 400,
      'invalid_request_error', 'messages');
    await expectError(client.messages.create({ model: 'nope', max_tokens: 4, messages: ask }), 404,
      'not_found_error', 'nope');
  }],
];

(async () => {
  let passed = 0;
  for (const [name, check] of checks) {
    try {
      await check();
      passed++;
      console.log(`ok   ${name}`);
    } catch (e) {
      console.log(`FAIL ${name}: ${e.stack || e}`);
    }
  }
  console.log(`${passed} of ${checks.length} checks passed`);
  process.exit(passed === checks.length ? 0 : 1);
})();
