// Template syntax as transformers' Jinja environment treats it: whitespace control with
// trim_blocks and lstrip_blocks on, loops, conditionals, set, macros, call and filter blocks.
// Expected outputs are worked out by hand from Jinja's documented semantics.
#include "gtest/gtest.h"
#include "tests/unit/chat/chat_test_util.h"

namespace tandem::chat {
namespace {

using testing::Json;
using testing::Render;

TEST(JinjaWhitespaceTest, DashStripsAllWhitespace) {
  EXPECT_EQ(Render("a  \n {{- 'x' -}} \n  b"), "axb");
  EXPECT_EQ(Render("a \n {%- if true -%} \n x \n {%- endif -%} \n b"), "axb");
  EXPECT_EQ(Render("a  {#- comment -#}  b"), "ab");
}

TEST(JinjaWhitespaceTest, TrimBlocksDropsOneNewlineAfterBlockTags) {
  EXPECT_EQ(Render("{% if true %}\nyes\n{% endif %}\nend"), "yes\nend");
  EXPECT_EQ(Render("{% if true %}\n\nyes{% endif %}"), "\nyes");
  // Not after output tags.
  EXPECT_EQ(Render("{{ 'x' }}\ny"), "x\ny");
  // '+' keeps the newline.
  EXPECT_EQ(Render("{% if true +%}\nx{% endif %}"), "\nx");
  EXPECT_EQ(Render("a{# c #}\nb"), "ab");
}

TEST(JinjaWhitespaceTest, LstripBlocksDropsIndentBeforeBlockTags) {
  EXPECT_EQ(Render("  {% if true %}\n  yes\n  {% endif %}\nend"), "  yes\nend");
  EXPECT_EQ(Render("a\n    {% if true %}\nb\n    {% endif %}\nc"), "a\nb\nc");
  EXPECT_EQ(Render("a\n  {# comment #}\nb"), "a\nb");
  // Only whitespace-only line prefixes, never output tags, and not with '+'.
  EXPECT_EQ(Render("x {% if true %}y{% endif %}"), "x y");
  EXPECT_EQ(Render("  {{ 'v' }}"), "  v");
  EXPECT_EQ(Render("  {%+ if true %}x{% endif %}"), "  x");
}

TEST(JinjaWhitespaceTest, NewlinesAreNormalizedAndOneTrailingNewlineDropped) {
  EXPECT_EQ(Render("hi\n"), "hi");
  EXPECT_EQ(Render("hi\n\n"), "hi\n");
  EXPECT_EQ(Render("a\r\nb\rc"), "a\nb\nc");
  EXPECT_EQ(Render("{% if true %}\r\nx{% endif %}"), "x");
}

TEST(JinjaWhitespaceTest, RawBlocksAreNotInterpreted) {
  EXPECT_EQ(Render("{% raw %}{{ x }} {% if %}{% endraw %}!"), "{{ x }} {% if %}!");
  EXPECT_EQ(Render("{%- raw -%}  a  {%- endraw %}"), "a");
}

TEST(JinjaLoopTest, LoopVariables) {
  EXPECT_EQ(Render("{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
                   "{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};"
                   "{% endfor %}"),
            "10TrueFalse332;21FalseFalse321;32FalseTrue310;");
  EXPECT_EQ(Render("{% for x in 'abc' %}{{ loop.previtem }}|{{ loop.nextitem }};{% endfor %}"),
            "|b;a|c;b|;");
  EXPECT_EQ(Render("{% for i in range(4) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}"), "abca");
  EXPECT_EQ(Render("{% for x in [1, 1, 2, 2, 1] %}{% if loop.changed(x) %}{{ x }}{% endif %}"
                   "{% endfor %}"),
            "121");
}

TEST(JinjaLoopTest, ElseFilterAndUnpacking) {
  EXPECT_EQ(Render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{% for x in [1, 2] if x > 5 %}{{ x }}{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(Render("{% for x in range(10) if x is odd %}{{ x }}:{{ loop.index }}/{{ loop.length }} "
                   "{% endfor %}"),
            "1:1/5 3:2/5 5:3/5 7:4/5 9:5/5 ");
  EXPECT_EQ(Render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}"),
            "a=1,b=2,");
  EXPECT_EQ(Render("{% for (a, b) in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}"), "37");
  EXPECT_EQ(Render("{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}"), "xy");
  EXPECT_EQ(Render("{% for c in 'héllo' %}[{{ c }}]{% endfor %}"), "[h][é][l][l][o]");
  EXPECT_EQ(Render("{% for x in missing %}x{% else %}undefined is empty{% endfor %}"),
            "undefined is empty");
}

TEST(JinjaLoopTest, NestedLoopsAndScoping) {
  EXPECT_EQ(Render("{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ b }}{% endfor %}"
                   "{{ loop.index }};{% endfor %}"),
            "1x2y1;1x2y2;");
  // A set inside a loop does not leak out of it, nor into the next iteration.
  EXPECT_EQ(Render("{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = 5 %}{{ x }}{% endfor %}"
                   "{{ x }}"),
            "15151");
}

TEST(JinjaLoopTest, BreakAndContinue) {
  EXPECT_EQ(Render("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}"
                   "{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
            "0134");
  EXPECT_EQ(
      Render("{% for i in range(3) %}{{ i }}{% if i == 1 %}{% break %}{% endif %}{% endfor %}"),
      "01");
}

TEST(JinjaLoopTest, IteratesASnapshot) {
  EXPECT_EQ(Render("{% set xs = [1, 2] %}{% for x in xs %}{% set _ = xs.append(x) %}{{ x }}"
                   "{% endfor %}{{ xs | length }}"),
            "124");
}

TEST(JinjaConditionalTest, IfElifElse) {
  const char* t = "{% if x == 1 %}one{% elif x == 2 %}two{% else %}other{% endif %}";
  EXPECT_EQ(Render(t, {{"x", 1}}), "one");
  EXPECT_EQ(Render(t, {{"x", 2}}), "two");
  EXPECT_EQ(Render(t, {{"x", 3}}), "other");
  EXPECT_EQ(Render(t), "other");
  EXPECT_EQ(Render("{% if messages %}yes{% else %}no{% endif %}", {{"messages", Json::array()}}),
            "no");
}

TEST(JinjaSetTest, AssignmentForms) {
  EXPECT_EQ(Render("{% set a, b = 1, 2 %}{{ a }}{{ b }}"), "12");
  EXPECT_EQ(Render("{% set t = 1, 2 %}{{ t }}"), "(1, 2)");
  EXPECT_EQ(Render("{% set x %}Hello {{ name }}{% endset %}[{{ x }}]", {{"name", "World"}}),
            "[Hello World]");
  EXPECT_EQ(Render("{% set x | upper | trim %}  abc {% endset %}[{{ x }}]"), "[ABC]");
  // A top-level set inside an if is seen after it.
  EXPECT_EQ(Render("{% if true %}{% set y = 'in' %}{% endif %}{{ y }}"), "in");
  // Context variables can be shadowed.
  EXPECT_EQ(Render("{% set add_generation_prompt = false %}{{ add_generation_prompt }}",
                   {{"add_generation_prompt", true}}),
            "False");
}

TEST(JinjaSetTest, NamespaceCarriesStateOutOfLoops) {
  EXPECT_EQ(Render("{% set ns = namespace(count=0, seen=false) %}{% for i in range(4) %}"
                   "{% set ns.count = ns.count + i %}{% endfor %}{{ ns.count }}{{ ns.seen }}"),
            "6False");
  EXPECT_EQ(Render("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c }}"), "12");
  EXPECT_EQ(Render("{% set ns = namespace(a=1) %}{{ ns }}"), "<Namespace {'a': 1}>");
}

TEST(JinjaMacroTest, DefaultsKeywordsAndScope) {
  EXPECT_EQ(Render("{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!"
                   "{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', greeting='Hi') }} "
                   "{{ greet(greeting='Yo', name='Cy') }}"),
            "Hello, Ann! Hi, Bob! Yo, Cy!");
  EXPECT_EQ(Render("{% macro m(a, b) %}[{{ a }}|{{ b }}]{% endmacro %}{{ m(1) }}"), "[1|]");
  EXPECT_EQ(Render("{% macro m(a, b=a * 2) %}{{ b }}{% endmacro %}{{ m(3) }}"), "6");
  EXPECT_EQ(Render("{% set g = 'G' %}{% macro m() %}{{ g }}{{ ctx }}{% endmacro %}{{ m() }}",
                   {{"ctx", "C"}}),
            "GC");
  // Macros return strings; a set inside one stays inside.
  EXPECT_EQ(Render("{% macro m() %}{% set v = 1 %}x{% endmacro %}{{ m() ~ m() }}{{ v }}"), "xx");
}

TEST(JinjaMacroTest, Recursion) {
  EXPECT_EQ(Render("{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1) | int }}"
                   "{% endif %}{% endmacro %}{{ fact(5) }}"),
            "120");
  // A JSON-schema style recursive renderer.
  EXPECT_EQ(Render("{% macro show(v) %}{% if v is mapping %}{% for k, x in v.items() %}{{ k }}"
                   "({{ show(x) }}){% endfor %}{% else %}{{ v }}{% endif %}{% endmacro %}"
                   "{{ show(schema) }}",
                   {{"schema", {{"a", {{"b", 1}}}, {"c", "d"}}}}),
            "a(b(1))c(d)");
}

TEST(JinjaMacroTest, CallBlocks) {
  EXPECT_EQ(Render("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}"
                   "{% call wrap('b') %}bold {{ x }}{% endcall %}",
                   {{"x", 1}}),
            "<b>bold 1</b>");
  EXPECT_EQ(Render("{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}"
                   "{% endmacro %}{% call(item) each([1, 2]) %}({{ item }}){% endcall %}"),
            "(1)(2)");
}

TEST(JinjaBlockTest, FilterAndGenerationBlocks) {
  EXPECT_EQ(Render("{% filter upper %}hello {{ name }}{% endfilter %}", {{"name", "world"}}),
            "HELLO WORLD");
  EXPECT_EQ(Render("{% filter trim | replace('a', 'b') %}  aa  {% endfilter %}"), "bb");
  EXPECT_EQ(Render("<{% generation %}answer {{ 1 }}{% endgeneration %}>"), "<answer 1>");
}

TEST(JinjaOutputTest, ValuesRenderAsPythonStr) {
  EXPECT_EQ(Render("{{ none }}|{{ None }}|{{ true }}|{{ False }}"), "None|None|True|False");
  EXPECT_EQ(Render("{{ [1, 'a', none, true, 1.5] }}"), "[1, 'a', None, True, 1.5]");
  EXPECT_EQ(Render("{{ {'a': 'b', 'c': [1]} }}"), "{'a': 'b', 'c': [1]}");
  EXPECT_EQ(Render("{{ (1, 2) }}|{{ (1,) }}|{{ () }}"), "(1, 2)|(1,)|()");
  EXPECT_EQ(Render("{{ [\"it's\"] }}|{{ ['a\"b'] }}|{{ ['\\n\\t\\\\'] }}"),
            "[\"it's\"]|['a\"b']|['\\n\\t\\\\']");
  EXPECT_EQ(Render("{{ ['\\x01', 'é', '\\u00a0'] }}"), "['\\x01', 'é', '\\xa0']");
  EXPECT_EQ(Render("{{ missing }}|{{ missing.attr.deeper }}|{{ missing['k'][0] }}"), "||");
  EXPECT_EQ(Render("{{ 1, 'a' }}"), "(1, 'a')");
  EXPECT_EQ(Render("{{ obj }}", {{"obj", {{"z", 1}, {"a", nullptr}}}}), "{'z': 1, 'a': None}");
}

TEST(JinjaOutputTest, StringLiterals) {
  EXPECT_EQ(Render("{{ 'a\\nb' }}|{{ \"q'\" }}|{{ 'x\\'y' }}|{{ 'ab' 'cd' }}"), "a\nb|q'|x'y|abcd");
  EXPECT_EQ(Render("{{ '\\u00e9\\U0001F600\\x41\\101\\d' }}"), "é😀AA\\d");
}

}  // namespace
}  // namespace tandem::chat
