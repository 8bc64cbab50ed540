// Built-in filters, with transformers' tojson (json.dumps, ensure_ascii=False, key order kept).
#include "gtest/gtest.h"
#include "tests/unit/chat/chat_test_util.h"

namespace tandem::chat {
namespace {

using testing::Json;
using testing::Render;

Json People() {
  return {{"users",
           {{{"name", "Ann"}, {"age", 31}, {"role", "admin"}},
            {{"name", "bob"}, {"age", 25}},
            {{"name", "Cy"}, {"age", 40}, {"role", nullptr}}}}};
}

TEST(JinjaFilterTest, ToJsonMatchesPythonJsonDumps) {
  EXPECT_EQ(Render("{{ {'b': 1, 'a': [1, 2.5, 'é\"\\n', none, true]} | tojson }}"),
            "{\"b\": 1, \"a\": [1, 2.5, \"é\\\"\\n\", null, true]}");
  EXPECT_EQ(Render("{{ {'a': [1, {}], 'b': []} | tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
  EXPECT_EQ(Render("{{ 'é😀' | tojson(ensure_ascii=true) }}"), "\"\\u00e9\\ud83d\\ude00\"");
  // Positional arguments follow transformers' signature (ensure_ascii first), not Jinja's.
  EXPECT_EQ(Render("{{ 'é' | tojson(true) }}"), "\"\\u00e9\"");
  EXPECT_EQ(Render("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}"), "{\"a\": 2, \"b\": 1}");
  EXPECT_EQ(Render("{{ '\\x01\\t' | tojson }} {{ [1.0, 1e20, 0.5, (1, 2)] | tojson }} "
                   "{{ {1: 'a', none: 'b', true: 'c'} | tojson }}"),
            "\"\\u0001\\t\" [1.0, 1e+20, 0.5, [1, 2]] {\"1\": \"c\", \"null\": \"b\"}");
  EXPECT_EQ(Render("{{ [1, [2]] | tojson(separators=(',', ':')) }}"), "[1,[2]]");
  // The context's key order is kept, as Python dicts keep it.
  EXPECT_EQ(Render("{{ obj | tojson }}", {{"obj", {{"z", 1}, {"a", {{"y", 2.25}, {"b", "x"}}}}}}),
            "{\"z\": 1, \"a\": {\"y\": 2.25, \"b\": \"x\"}}");
}

TEST(JinjaFilterTest, StringFilters) {
  EXPECT_EQ(
      Render(
          "[{{ '  x \\n' | trim }}] [{{ 'xxaxx' | trim('x') }}] [{{ 'hello WORLD' | capitalize }}] "
          "[{{ \"hello-world it's\" | title }}] [{{ 'aB' | upper }}{{ 'aB' | lower }}]"),
      "[x] [a] [Hello world] [Hello-World It's] [ABab]");
  EXPECT_EQ(Render("{{ 'aXbX' | replace('X', '-') }} {{ 'aaa' | replace('a', 'b', 1) }} "
                   "{{ 12 | string + 'x' }} {{ 'Hello, wonderful world!' | wordcount }}"),
            "a-b- baa 12x 3");
  EXPECT_EQ(Render("{{ '<a href=\"x\">&\\'' | e }} {{ '<b>' | escape }} {{ '<i>' | safe }}"),
            "&lt;a href=&#34;x&#34;&gt;&amp;&#39; &lt;b&gt; <i>");
  EXPECT_EQ(Render("{{ 'ab' | center(6) }}|"), "  ab  |");
}

TEST(JinjaFilterTest, Indent) {
  EXPECT_EQ(Render("{{ 'a\\nb\\n\\nc' | indent(2) }}"), "a\n  b\n\n  c");
  EXPECT_EQ(Render("{{ 'a\\nb\\n\\nc' | indent(2, true) }}"), "  a\n  b\n\n  c");
  EXPECT_EQ(Render("{{ 'a\\nb\\n\\nc' | indent(2, blank=true) }}"), "a\n  b\n  \n  c");
  EXPECT_EQ(Render("{{ 'a\\nb' | indent('> ') }}|{{ 'x' | indent }}"), "a\n> b|x");
}

TEST(JinjaFilterTest, NumberFilters) {
  EXPECT_EQ(
      Render("{{ '42' | int + 1 }} {{ '3.9' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} "
             "{{ 3.99 | int }} {{ ' 12 ' | int }} {{ '1_000' | int }} {{ '0x1A' | int(0, 16) }} "
             "{{ true | int }}"),
      "43 3 0 7 3 12 1000 26 1");
  EXPECT_EQ(Render("{{ '2.5' | float }} {{ 'abc' | float }} {{ 3 | float }} {{ ' 1e3 ' | float }}"),
            "2.5 0.0 3.0 1000.0");
  EXPECT_EQ(Render("{{ -3 | abs }} {{ -2.5 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} "
                   "{{ 2.675 | round(2) }} {{ 2.1 | round(0, 'ceil') }} "
                   "{{ 2.9 | round(method='floor') }} {{ 5 | round }} {{ 1234 | round(-2) }}"),
            "3 2.5 2.0 4.0 2.67 3.0 2.0 5 1200");
  EXPECT_EQ(
      Render("{{ [1, 2, 3] | sum }} {{ [1.5, 2] | sum }} {{ [1] | sum(start=10) }} "
             "{{ users | sum(attribute='age') }} {{ [3, 1, 2] | min }} {{ ['b', 'A'] | max }} "
             "{{ users | max(attribute='age') | attr('get') is callable }}",
             People()),
      "6 3.5 11 96 1 b True");
}

TEST(JinjaFilterTest, Defaults) {
  EXPECT_EQ(Render("[{{ missing | default('d') }}] [{{ '' | default('d') }}] "
                   "[{{ '' | default('d', true) }}] [{{ none | d('x') }}] [{{ missing | d }}]"),
            "[d] [] [d] [None] []");
}

TEST(JinjaFilterTest, SequenceFilters) {
  EXPECT_EQ(Render("{{ 'héllo' | length }} {{ [1, 2] | count }} {{ {'a': 1} | length }} "
                   "{{ missing | length }} {{ [1, 2, 3] | first }} {{ 'abc' | last }} "
                   "[{{ [] | first }}] {{ 'ab' | list }} {{ missing | list }}"),
            "5 2 1 0 1 c [] ['a', 'b'] []");
  EXPECT_EQ(Render("{{ [1, 'a', none] | join('-') }} {{ [1, 2] | join }} "
                   "{{ users | join(', ', attribute='name') }}",
                   People()),
            "1-a-None 12 Ann, bob, Cy");
  EXPECT_EQ(Render("{{ 'abc' | reverse }} {{ [1, 2] | reverse | list }} "
                   "{{ [1, 2, 3, 4, 5] | batch(2) | list }} {{ [1, 2, 3] | batch(2, 0) | list }}"),
            "cba [2, 1] [[1, 2], [3, 4], [5]] [[1, 2], [3, 0]]");
  EXPECT_EQ(Render("{% for k, v in {'a': 1} | items %}{{ k }}{{ v }}{% endfor %} "
                   "{{ missing | items | list }} {{ {'b': 1, 'A': 2, 'c': 0} | dictsort }} "
                   "{{ {'b': 1, 'A': 2, 'c': 0} | dictsort(by='value') }}"),
            "a1 [] [('A', 2), ('b', 1), ('c', 0)] [('c', 0), ('b', 1), ('A', 2)]");
}

TEST(JinjaFilterTest, SortAndUnique) {
  EXPECT_EQ(Render("{{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A', 'c'] | sort(case_sensitive=true) }} "
                   "{{ [3, 1, 2] | sort(reverse=true) }} "
                   "{{ users | sort(attribute='age') | map(attribute='name') | join }} "
                   "{{ users | sort(attribute='name') | map(attribute='name') | join }}",
                   People()),
            "['A', 'b', 'c'] ['A', 'b', 'c'] [3, 2, 1] bobAnnCy AnnbobCy");
  EXPECT_EQ(Render("{{ ['a', 'A', 'b', 'a'] | unique | list }} "
                   "{{ ['a', 'A'] | unique(case_sensitive=true) | list }} "
                   "{{ users | unique(attribute='role') | map(attribute='name') | list }}",
                   People()),
            "['a', 'b'] ['a', 'A'] ['Ann', 'bob', 'Cy']");
}

TEST(JinjaFilterTest, SelectRejectMap) {
  Json ctx = People();
  ctx["messages"] = {{{"role", "system"}, {"content", "s"}},
                     {{"role", "user"}, {"content", "u1"}},
                     {{"role", "assistant"}, {"content", nullptr}},
                     {{"role", "user"}, {"content", "u2"}}};
  EXPECT_EQ(Render("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') "
                   "| join(',') }} {{ messages | rejectattr('content', 'none') | list | length }} "
                   "{{ users | selectattr('role') | map(attribute='name') | list }} "
                   "{{ users | selectattr('role', 'defined') | list | length }} "
                   "{{ messages | selectattr('role', '==', 'system') | list | length }}",
                   ctx),
            "u1,u2 3 ['Ann'] 2 1");
  EXPECT_EQ(
      Render(
          "{{ [1, 2, 3, 4] | select('odd') | list }} {{ [0, 1, '', 'a'] | select | list }} "
          "{{ [1, 2, 3] | reject('gt', 1) | list }} {{ [1, 2, 3] | select('in', [2, 3]) | list }}"),
      "[1, 3] [1, 'a'] [1] [2, 3]");
  EXPECT_EQ(
      Render("{{ ['a', 'b'] | map('upper') | join }} {{ [' a ', 'b '] | map('trim') | list }} "
             "{{ ['a', 'b'] | map('replace', 'a', 'x') | join }} "
             "{{ users | map(attribute='missing', default='?') | join }} "
             "{{ [[1, 2], [3]] | map('length') | list }} {{ [{'a': {'b': 7}}] | "
             "map(attribute='a.b') | list }}",
             ctx),
      "AB ['a', 'b'] xb ??? [2, 1] [7]");
}

TEST(JinjaFilterTest, Format) {
  EXPECT_EQ(
      Render("{{ '%s is %d years' | format('Ann', 30) }}|{{ '%05.1f|%-4s|%x' | format(3.14159, "
             "'ab', 255) }}|{{ '%(a)s' | format(a='x') }}"),
      "Ann is 30 years|003.1|ab  |ff|x");
  EXPECT_EQ(
      Render("{{ '%s-%s' % (1, 2) }} {{ '%d%%' % 50 }} {{ '%r' % 'q' }} {{ '%5.2e' % 12345.678 }}"),
      "1-2 50% 'q' 1.23e+04");
}

}  // namespace
}  // namespace tandem::chat
