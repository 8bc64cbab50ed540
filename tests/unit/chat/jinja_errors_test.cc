// Failures: unsupported constructs at load time (named, with the line), runtime errors with
// the line, raise_exception, and the render limits (output, iterations, recursion, memory)
// and the parser's nesting bounds, so that no template can crash, hang or exhaust the host.
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/chat/chat_test_util.h"

namespace tandem::chat {
namespace {

using testing::CompileStatus;
using ::testing::HasSubstr;
using testing::Json;
using testing::Render;
using testing::RenderStatus;

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(JinjaLoadErrorTest, UnsupportedTagsNameTheTagAndLine) {
  auto s = CompileStatus("line1\n{% if true %}\n{% include 'x.jinja' %}{% endif %}");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "chat template line 3: unsupported tag 'include'");
  for (const char* tag :
       {"extends", "block", "import", "from", "with", "do", "autoescape", "trans"}) {
    auto st = CompileStatus(std::string("{% ") + tag + " x %}");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << tag;
    EXPECT_EQ(st.message(), std::string("chat template line 1: unsupported tag '") + tag + "'");
  }
  EXPECT_EQ(CompileStatus("{% for x in y recursive %}{% endfor %}").message(),
            "chat template line 1: unsupported construct 'recursive' loop");
  EXPECT_THAT(std::string(CompileStatus("{{ f(*args) }}").message()),
              HasSubstr("argument unpacking"));
}

TEST(JinjaLoadErrorTest, UnknownFiltersAndTestsAreLoadErrors) {
  EXPECT_EQ(CompileStatus("\n\n{{ x | nope }}").message(),
            "chat template line 3: unknown filter 'nope'");
  EXPECT_EQ(CompileStatus("{% if x is nope %}{% endif %}").message(),
            "chat template line 1: unknown test 'nope'");
  EXPECT_THAT(std::string(CompileStatus("{{ xs | select('nope') | list }}").message()),
              HasSubstr("unknown test 'nope' in select()"));
  EXPECT_THAT(std::string(CompileStatus("{{ xs | selectattr('a', 'nope') | list }}").message()),
              HasSubstr("unknown test 'nope'"));
  EXPECT_THAT(std::string(CompileStatus("{{ xs | map('nope') | list }}").message()),
              HasSubstr("unknown filter 'nope' in map()"));
  // A template the engine cannot run must never load silently, even in a dead branch.
  EXPECT_FALSE(CompileStatus("{% if false %}{{ x | nope }}{% endif %}").ok());
}

TEST(JinjaLoadErrorTest, SyntaxErrors) {
  EXPECT_THAT(std::string(CompileStatus("{{ x").message()), HasSubstr("missing '}}'"));
  EXPECT_THAT(std::string(CompileStatus("{% if x %}\nno end").message()),
              HasSubstr("'{% if %}' on line 1 needs '{% endif %}'"));
  EXPECT_THAT(std::string(CompileStatus("{% for x in y %}").message()),
              HasSubstr("needs '{% endfor %}'"));
  EXPECT_THAT(std::string(CompileStatus("{% endfor %}").message()),
              HasSubstr("unexpected 'endfor' tag"));
  EXPECT_THAT(std::string(CompileStatus("{% for x y %}{% endfor %}").message()),
              HasSubstr("expected 'in'"));
  EXPECT_THAT(std::string(CompileStatus("{{ 'abc }}").message()), HasSubstr("unterminated string"));
  EXPECT_THAT(std::string(CompileStatus("a {# b").message()), HasSubstr("unclosed comment"));
  EXPECT_THAT(std::string(CompileStatus("{{ a $ b }}").message()),
              HasSubstr("unexpected character '$'"));
  EXPECT_THAT(std::string(CompileStatus("{{ (a }}").message()), HasSubstr("unexpected '}'"));
  EXPECT_THAT(std::string(CompileStatus("{% break %}").message()), HasSubstr("outside of a loop"));
  EXPECT_THAT(std::string(CompileStatus("{{ }}").message()), HasSubstr("expected an expression"));
  EXPECT_THAT(std::string(CompileStatus("{% raw %}x").message()), HasSubstr("endraw"));
  EXPECT_THAT(std::string(CompileStatus("{% macro m(a=1, b) %}{% endmacro %}").message()),
              HasSubstr("non-default argument"));
}

TEST(JinjaLoadErrorTest, NameIsUsedInMessages) {
  auto s = ChatTemplate::Compile("{% include 'x' %}", "models/m/chat_template.jinja").status();
  EXPECT_EQ(s.message(), "models/m/chat_template.jinja line 1: unsupported tag 'include'");
}

TEST(JinjaRenderErrorTest, RaiseExceptionCarriesTheMessage) {
  const char* t =
      "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
      "{% endif %}ok";
  Json system = {{"messages", {{{"role", "system"}, {"content", "x"}}}}};
  auto s = RenderStatus(t, system);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "System role not supported");
  EXPECT_EQ(Render(t, {{"messages", {{{"role", "user"}, {"content", "x"}}}}}), "ok");
}

TEST(JinjaRenderErrorTest, ErrorsNameTheLine) {
  EXPECT_EQ(RenderStatus("a\n{{ 1 / 0 }}").message(), "chat template line 2: division by zero");
  EXPECT_EQ(RenderStatus("{{ foo() }}").message(), "chat template line 1: 'foo' is undefined");
  EXPECT_EQ(RenderStatus("{{ 'x'.nope() }}").message(),
            "chat template line 1: 'str object' has no attribute 'nope'");
  EXPECT_EQ(RenderStatus("\n\n{{ 'a' + 1 }}").message(),
            "chat template line 3: unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_THAT(std::string(RenderStatus("{{ [1, 'a'] | sort }}").message()),
              HasSubstr("'<' not supported between instances of 'str' and 'int'"));
  EXPECT_THAT(std::string(RenderStatus("{{ none | tojson }}{{ missing | tojson }}").message()),
              HasSubstr("Undefined is not JSON serializable"));
  EXPECT_THAT(std::string(RenderStatus("{% set x = 1 %}{% set x.a = 2 %}").message()),
              HasSubstr("non-namespace"));
  EXPECT_THAT(std::string(RenderStatus("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}").message()),
              HasSubstr("takes not more than 1 argument"));
  EXPECT_THAT(std::string(RenderStatus("{% for a, b in [1] %}{% endfor %}").message()),
              HasSubstr("unpack"));
  EXPECT_THAT(std::string(RenderStatus("{{ 10 ** 100 }}").message()), HasSubstr("overflow"));
}

TEST(JinjaRenderErrorTest, ContextMustBeAnObject) {
  auto tmpl = ChatTemplate::Compile("x");
  ASSERT_TRUE(tmpl.ok());
  EXPECT_EQ((*tmpl)->Render(Json::array()).status().code(), absl::StatusCode::kInvalidArgument);
}

ChatTemplateOptions Limits(size_t output, int64_t iterations) {
  ChatTemplateOptions options;
  options.limits.max_output_bytes = output;
  options.limits.max_loop_iterations = iterations;
  return options;
}

TEST(JinjaLimitTest, OutputBytes) {
  auto s = RenderStatus("{% for i in range(2000) %}x{% endfor %}", Json::object(),
                        Limits(1000, 1 << 20));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("exceeds 1000 bytes"));
  EXPECT_EQ(Render("{% for i in range(1000) %}x{% endfor %}", Json::object(), Limits(1000, 1 << 20))
                .size(),
            1000u);
}

TEST(JinjaLimitTest, LoopIterations) {
  auto s = RenderStatus("{% for i in range(50) %}{% for j in range(50) %}{% endfor %}{% endfor %}",
                        Json::object(), Limits(1 << 20, 100));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("loop iterations"));
}

TEST(JinjaLimitTest, RecursionDepth) {
  auto s = RenderStatus("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  // A list that contains itself cannot be printed or serialized, but fails cleanly.
  EXPECT_EQ(RenderStatus("{% set xs = [] %}{% set _ = xs.append(xs) %}{{ xs }}").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RenderStatus("{% set xs = [] %}{% set _ = xs.append(xs) %}{{ xs | tojson }}").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Render("{% set xs = [] %}{% set _ = xs.append(xs) %}{{ xs == xs }}"), "True");
  // Deeply nested blocks inside a recursive macro: bounded by frames and stack bytes, which
  // hold under sanitizers too (their frames are several times larger).
  for (const char* open : {"{% if true %}", "{% for x in [1] %}", "{% filter trim %}"}) {
    std::string close = std::string(open).find("for") != std::string::npos  ? "{% endfor %}"
                        : std::string(open).find("if") != std::string::npos ? "{% endif %}"
                                                                            : "{% endfilter %}";
    std::string source = "{% macro r(n) %}" + Repeat(open, 250) + "{{ r(n + 1) }}" +
                         Repeat(close, 250) + "{% endmacro %}{{ r(0) }}";
    EXPECT_EQ(RenderStatus(source).code(), absl::StatusCode::kResourceExhausted) << open;
  }
}

TEST(JinjaLimitTest, Memory) {
  EXPECT_EQ(RenderStatus("{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                         "{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RenderStatus("{% set ns = namespace(l=[1]) %}{% for i in range(64) %}"
                         "{% set ns.l = ns.l + ns.l %}{% endfor %}")
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RenderStatus("{{ 'x' * 100000000000 }}").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RenderStatus("{{ [1] * 100000000000 }}").code(), absl::StatusCode::kResourceExhausted);
  // A count past 2**64 once wrapped to 0 and divided by it.
  EXPECT_EQ(RenderStatus("{{ 'ab' * 18446744073709551616 }}").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Render("[{{ '' * 10 ** 30 }}{{ [] * 10 ** 30 }}]"), "[[]]");
  EXPECT_EQ(RenderStatus("{{ range(100001) | length }}").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RenderStatus("{{ 'ab'.center(100000000000) }}").code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(JinjaLimitTest, ParserBoundsNesting) {
  const int kDeep = 100000;
  for (const std::string& source :
       {"{{ " + Repeat("(", kDeep) + "1" + Repeat(")", kDeep) + " }}",
        "{{ " + Repeat("[", kDeep) + Repeat("]", kDeep) + " }}",
        "{{ " + Repeat("not ", kDeep) + "x }}", "{{ " + Repeat("-", kDeep) + "1 }}",
        "{{ x" + Repeat(" | trim", kDeep) + " }}", "{{ 1" + Repeat(" + 1", kDeep) + " }}",
        "{{ x" + Repeat(".a", kDeep) + " }}", "{{ x" + Repeat("[0]", kDeep) + " }}",
        "{{ 1" + Repeat(" if x else 1", kDeep) + " }}",
        Repeat("{% if true %}", kDeep) + Repeat("{% endif %}", kDeep),
        Repeat("{% for x in y %}", kDeep)}) {
    auto s = CompileStatus(source);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << source.substr(0, 40);
    EXPECT_THAT(std::string(s.message()), HasSubstr("too deeply")) << source.substr(0, 40);
  }
  // Reasonable nesting is fine.
  EXPECT_EQ(Render("{{ " + Repeat("(", 50) + "1" + Repeat(")", 50) + " }}"), "1");
  EXPECT_EQ(Render(Repeat("{% if true %}", 100) + "x" + Repeat("{% endif %}", 100)), "x");
}

TEST(JinjaLimitTest, DeepContextIsRejected) {
  Json deep = 1;
  for (int i = 0; i < 1000; ++i) deep = Json::array({deep});
  EXPECT_EQ(RenderStatus("{{ x }}", {{"x", deep}}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(JinjaConcurrencyTest, RendersFromManyThreads) {
  auto tmpl = ChatTemplate::Compile(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{{ m.content | upper }}{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(tmpl.ok());
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        Json ctx = {{"messages", {{{"content", absl::StrCat("a", t)}}, {{"content", "b"}}}}};
        auto out = (*tmpl)->Render(ctx);
        if (!out.ok() || *out != absl::StrCat("A", t, "B2")) ++failures[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

}  // namespace
}  // namespace tandem::chat
