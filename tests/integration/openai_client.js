// Drives Tandem's HTTP front door with the official `openai` npm client (a client Tandem did not
// write) and prints what it saw as one JSON line, for http_api_test.py to check.
// usage: node openai_client.js NODE_MODULES BASE_URL MODEL
'use strict';

const [, , modules, baseURL, model] = process.argv;
const OpenAI = require(require.resolve('openai', { paths: [modules] }));

const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'unused', maxRetries: 0 });
const prompt = 'def quicksort(arr):';

async function errorOf(promise) {
  try {
    await promise;
    return null;
  } catch (e) {
    return { status: e.status, param: e.param ?? null, type: e.type ?? null, code: e.code ?? null,
             message: e.message };
  }
}

async function main() {
  const out = {};
  const greedy = await client.completions.create({ model, prompt, max_tokens: 40, temperature: 0 });
  out.greedy = { text: greedy.choices[0].text, finish: greedy.choices[0].finish_reason,
                 usage: greedy.usage, id: greedy.id, object: greedy.object };

  const stream = await client.completions.create({
    model, prompt, max_tokens: 40, temperature: 0, stream: true,
    stream_options: { include_usage: true } });
  const s = { text: '', finish: null, usage: null, events: 0 };
  for await (const chunk of stream) {
    s.events++;
    if (chunk.usage) s.usage = chunk.usage;
    for (const c of chunk.choices) {
      s.text += c.text;
      if (c.finish_reason) s.finish = c.finish_reason;
    }
  }
  out.stream = s;

  // n choices with a seed: the same seed draws the same choices again.
  const seeded = () => client.completions.create({ model, prompt, max_tokens: 12, temperature: 1,
                                                   n: 3, seed: 1234 });
  const a = await seeded();
  const b = await seeded();
  out.seeded = { a: a.choices.map((c) => c.text), b: b.choices.map((c) => c.text),
                 indexes: a.choices.map((c) => c.index) };

  // seed 0 is a seed like any other (not "random").
  const zero = () => client.completions.create({ model, prompt, max_tokens: 12, temperature: 1,
                                                 seed: 0 });
  out.seed_zero = [(await zero()).choices[0].text, (await zero()).choices[0].text];

  // echo: the prompt, then the completion; with logprobs the prompt's tokens lead, the first
  // without a log-probability; streamed, the prompt arrives in the first event.
  const echo = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0,
                                                 echo: true, logprobs: 1 });
  const echoStream = await client.completions.create({ model, prompt, max_tokens: 8,
                                                       temperature: 0, echo: true, stream: true });
  const es = { first: null, text: '' };
  for await (const chunk of echoStream) {
    for (const c of chunk.choices) {
      if (es.first === null) es.first = c.text;
      es.text += c.text;
    }
  }
  out.echo = { text: echo.choices[0].text, logprobs: echo.choices[0].logprobs,
               usage: echo.usage, stream: es };

  // A stop string from the middle of the greedy text.
  const stop = greedy.choices[0].text.slice(10, 14);
  const stopped = await client.completions.create({ model, prompt, max_tokens: 40, temperature: 0,
                                                    stop: [stop] });
  out.stop = { stop, text: stopped.choices[0].text, finish: stopped.choices[0].finish_reason };

  // Log-probabilities: greedy, so each sampled token is its own top alternative.
  const lp = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0,
                                               logprobs: 3 });
  out.logprobs = { text: lp.choices[0].text, logprobs: lp.choices[0].logprobs };
  // Penalties change what greedy decoding says.
  const penalized = await client.completions.create({ model, prompt, max_tokens: 40,
                                                      temperature: 0, frequency_penalty: 1.5,
                                                      presence_penalty: 1.0 });
  out.penalized = penalized.choices[0].text;

  // Chat: the bundled model's template renders a system message as a docstring and a user
  // message as a comment after <|bos|>; the same text through /v1/completions (which adds BOS)
  // must continue the same way.
  const messages = [{ role: 'system', content: 'Sorting helpers.' },
                    { role: 'user', content: 'Write quicksort' }];
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 24,
                                                      temperature: 0 });
  const same = await client.completions.create({
    model, prompt: '"""Sorting helpers."""\n\n# Write quicksort\n', max_tokens: 24,
    temperature: 0 });
  const chatStream = await client.chat.completions.create({
    model, messages, max_completion_tokens: 24, temperature: 0, stream: true,
    stream_options: { include_usage: true }, logprobs: true, top_logprobs: 2 });
  const cs = { content: '', roles: [], finish: null, usage: null, logprobs: 0, object: null };
  for await (const chunk of chatStream) {
    cs.object = chunk.object;
    if (chunk.usage) cs.usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) cs.roles.push(c.delta.role);
      cs.content += c.delta.content ?? '';
      if (c.finish_reason) cs.finish = c.finish_reason;
      if (c.logprobs) cs.logprobs += c.logprobs.content.length;
    }
  }
  out.chat = { message: chat.choices[0].message, object: chat.object, id: chat.id,
               finish: chat.choices[0].finish_reason, usage: chat.usage,
               completion: same.choices[0].text, stream: cs };
  out.chat_errors = {
    role: await errorOf(client.chat.completions.create({
      model, messages: [{ role: 'tool', content: 'x', tool_call_id: '1' }] })),
    image: await errorOf(client.chat.completions.create({
      model, messages: [{ role: 'user', content: [{ type: 'image_url',
                                                    image_url: { url: 'http://x/y.png' } }] }] })),
    tools: await errorOf(client.chat.completions.create({
      model, messages, tools: [{ type: 'function', function: { name: 'f' } }] })),
  };

  out.errors = {
    zero_tokens: await errorOf(client.completions.create({ model, prompt, max_tokens: 0 })),
    model: await errorOf(client.completions.create({ model: 'no-such-model', prompt,
                                                     max_tokens: 4 })),
    max_tokens: await errorOf(client.completions.create({ model, prompt, max_tokens: 100000 })),
  };
  out.models = (await client.models.list()).data;

  // A client that aborts mid-stream.
  const ac = new AbortController();
  const long = await client.completions.create(
    { model, prompt, max_tokens: 1500, temperature: 0, ignore_eos: true, stream: true },
    { signal: ac.signal });
  let got = 0;
  try {
    for await (const chunk of long) {
      if (chunk.choices.length > 0 && ++got === 3) ac.abort();
    }
  } catch (e) {
    if (e.name !== 'AbortError' && !ac.signal.aborted) throw e;
  }
  out.abort = { aborted: ac.signal.aborted, got };
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
