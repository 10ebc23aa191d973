// Sends an image to a live offgraph server (started with a projector) through the official
// `openai` npm package (pinned by scripts/npm-client.sh), the way the README shows it. Usage:
//   node openai_image_client.cjs NPM_DIR BASE_URL API_KEY PNG_PATH
// Exits 0 when every check holds; prints each check, `image_tokens=N` (what the server counted,
// for the caller to compare with the encoder's rows) and, on failure, what was seen.
'use strict';
const fs = require('fs');
const path = require('path');
const assert = require('assert/strict');

const [npmDir, base, key, pngPath] = process.argv.slice(2);
const OpenAI = require(path.join(npmDir, 'node_modules', 'openai'));
const client = new OpenAI({ baseURL: base + '/v1', apiKey: key, maxRetries: 0, timeout: 120000 });

const png = fs.readFileSync(pngPath).toString('base64');
const question = (url, text = 'What is in this picture?') => [{ role: 'user', content: [
  { type: 'image_url', image_url: { url } },
  { type: 'text', text } ] }];
const imageMessages = question(`data:image/png;base64,${png}`);

const checks = [
  ['the README request: an image as a data: URI, usage counts its tokens', async () => {
    // As the README writes it (no temperature), then at temperature 0 for the streamed check.
    const r = await client.chat.completions.create({ model: 'offgraph', max_tokens: 64,
      messages: imageMessages });
    assert.equal(r.object, 'chat.completion');
    assert.equal(typeof r.choices[0].message.content, 'string');
    const imageTokens = r.usage.prompt_tokens_details.image_tokens;
    assert.ok(Number.isInteger(imageTokens) && imageTokens > 0, `image_tokens ${imageTokens}`);
    // The same question without the image: the image adds its rows and two markers.
    const plain = await client.chat.completions.create({ model: 'offgraph', max_tokens: 1,
      messages: [{ role: 'user', content: [{ type: 'text', text: 'What is in this picture?' }] }] });
    assert.equal(plain.usage.prompt_tokens_details.image_tokens, undefined);
    assert.equal(r.usage.prompt_tokens, plain.usage.prompt_tokens + imageTokens + 2);
    console.log(`image_tokens=${imageTokens} prompt_tokens=${r.usage.prompt_tokens} ` +
                `answer=${JSON.stringify(r.choices[0].message.content.slice(0, 40))}`);
    globalThis.imageTokens = imageTokens;
    globalThis.whole = await client.chat.completions.create({ model: 'offgraph', max_tokens: 64,
      temperature: 0, messages: imageMessages });
    assert.equal(globalThis.whole.usage.prompt_tokens_details.image_tokens, imageTokens);
  }],
  ['streamed with include_usage: the deltas add up to the same answer', async () => {
    const stream = await client.chat.completions.create({ model: 'offgraph', max_tokens: 64,
      temperature: 0, messages: imageMessages, stream: true,
      stream_options: { include_usage: true } });
    let content = '', usage = null, chunks = 0;
    for await (const chunk of stream) {
      chunks++;
      if (chunk.usage) usage = chunk.usage;
      if (!chunk.choices.length) continue;
      content += chunk.choices[0].delta.content || '';
    }
    const w = globalThis.whole;
    assert.equal(content, w.choices[0].message.content);
    assert.ok(usage, 'no usage chunk');
    assert.equal(usage.prompt_tokens_details.image_tokens, globalThis.imageTokens);
    assert.equal(usage.prompt_tokens, w.usage.prompt_tokens);
    assert.equal(usage.completion_tokens, w.usage.completion_tokens);
    console.log(`     ${chunks} chunks, ${usage.completion_tokens} completion tokens`);
  }],
  ['an https image URL is refused: 400 naming data: URIs', async () => {
    try {
      await client.chat.completions.create({ model: 'offgraph', max_tokens: 4,
        messages: question('https://example.com/photo.png') });
    } catch (e) {
      assert.ok(e instanceof OpenAI.APIError, `not an APIError: ${e}`);
      assert.ok(e instanceof OpenAI.BadRequestError, `not a BadRequestError: ${e}`);
      assert.equal(e.status, 400, `status ${e.status}: ${e.message}`);
      assert.match(e.message, /data: URI/);
      console.log(`     ${e.message} (param ${e.param})`);
      return;
    }
    assert.fail('expected HTTP 400');
  }],
  ['the same image twice: the second reuses the prompt past the image', async () => {
    const messages = question(`data:image/png;base64,${png}`, 'Describe it in one word.');
    const first = await client.chat.completions.create({ model: 'offgraph', max_tokens: 4,
      temperature: 0, messages });
    const second = await client.chat.completions.create({ model: 'offgraph', max_tokens: 4,
      temperature: 0, messages });
    const cached = second.usage.prompt_tokens_details.cached_tokens;
    assert.equal(second.usage.prompt_tokens_details.image_tokens, globalThis.imageTokens);
    assert.ok(cached > globalThis.imageTokens,
              `cached_tokens ${cached}, image_tokens ${globalThis.imageTokens}`);
    // Past where the first one stopped reusing (the earlier requests' text after the image).
    assert.ok(cached > first.usage.prompt_tokens_details.cached_tokens,
              `cached_tokens ${first.usage.prompt_tokens_details.cached_tokens} then ${cached}`);
    assert.equal(second.choices[0].message.content, first.choices[0].message.content);
    console.log(`     cached_tokens ${first.usage.prompt_tokens_details.cached_tokens} then ` +
                `${cached} of ${second.usage.prompt_tokens}`);
  }],
];

(async () => {
  let failed = 0;
  for (const [name, run] of checks) {
    try {
      await run();
      console.log(`ok   ${name}`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
    }
  }
  console.log(`${checks.length - failed} of ${checks.length} checks passed`);
  process.exit(failed ? 1 : 0);
})();
