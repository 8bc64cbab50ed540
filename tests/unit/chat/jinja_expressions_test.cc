// Expressions with Python semantics: numbers, operators, precedence, truthiness, tests,
// subscripts and slices (counting code points), and methods of str, list and dict.
#include "gtest/gtest.h"
#include "tests/unit/chat/chat_test_util.h"

namespace tandem::chat {
namespace {

using testing::Json;
using testing::Render;

TEST(JinjaNumberTest, PythonArithmetic) {
  EXPECT_EQ(Render("{{ 7 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} "
                   "{{ 7 % -3 }}"),
            "3.5 2.0 3 -4 1 2 -2");
  EXPECT_EQ(Render("{{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }} {{ 7.0 // 2 }} {{ -7.5 % 2 }}"),
            "1024 0.5 64 3.0 0.5");
  EXPECT_EQ(Render("{{ 1 + 2.5 }} {{ true + 1 }} {{ 10 - 0.5 }} {{ 3 * 1.5 }}"), "3.5 2 9.5 4.5");
}

TEST(JinjaNumberTest, FormatsLikePythonStr) {
  EXPECT_EQ(Render("{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e3 }} {{ 1.5e-7 }} {{ 1e16 }} {{ 1e15 }} "
                   "{{ 0.0001 }} {{ -0.0 }} {{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }}"),
            "1.0 0.30000000000000004 1000.0 1.5e-07 1e+16 1000000000000000.0 0.0001 -0.0 1000 "
            "31 15 5");
  EXPECT_EQ(Render("{{ 10 ** 20 }} {{ n }} {{ big }} {{ f }}",
                   {{"n", 123456789012345678LL}, {"big", 18446744073709551615ULL}, {"f", 2.0}}),
            "100000000000000000000 123456789012345678 18446744073709551615 2.0");
}

TEST(JinjaOperatorTest, StringsAndSequences) {
  EXPECT_EQ(Render("{{ 'a' + 'b' }} {{ 3 * 'ab' }} {{ 'ab' * 2 }} {{ [1] * 3 }} {{ [1] + [2] }} "
                   "{{ (1,) + (2,) }}"),
            "ab ababab abab [1, 1, 1] [1, 2] (1, 2)");
  EXPECT_EQ(Render("{{ 1 ~ 'a' ~ none ~ true ~ missing ~ 1.5 }}"), "1aNoneTrue1.5");
}

TEST(JinjaOperatorTest, Comparisons) {
  EXPECT_EQ(Render("{{ 1 == 1.0 }} {{ 1 == true }} {{ '1' == 1 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} "
                   "{{ 'abc' < 'abd' }} {{ [1, 2] < [1, 3] }} {{ 2 >= 2 }} {{ 1 != 1 }}"),
            "True True False True False True True True False");
  EXPECT_EQ(Render("{{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }} {{ none == none }} "
                   "{{ missing == none }} {{ [1, [2]] == [1, [2]] }} {{ (1, 2) == [1, 2] }}"),
            "True True False True False");
}

TEST(JinjaOperatorTest, Membership) {
  EXPECT_EQ(Render("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} "
                   "{{ 'x' in missing }} {{ 'é' in 'café' }}"),
            "True True True True False True");
}

TEST(JinjaOperatorTest, LogicReturnsOperandsAndShortCircuits) {
  EXPECT_EQ(Render("[{{ 0 or 'x' }}] [{{ 'a' and 'b' }}] [{{ '' and 'b' }}] [{{ none or [] }}] "
                   "[{{ not '' }}] [{{ not [1] }}]"),
            "[x] [b] [] [[]] [True] [False]");
  EXPECT_EQ(Render("{{ false and raise_exception('no') }} {{ true or raise_exception('no') }}"),
            "False True");
  EXPECT_EQ(Render("{{ 'y' if 1 else 'n' }}|{{ 'y' if 0 }}|{{ 'a' if false else 'b' if false else "
                   "'c' }}"),
            "y||c");
}

TEST(JinjaOperatorTest, Truthiness) {
  EXPECT_EQ(Render("{% for v in [0, 0.0, '', [], {}, none, false, 1, 'a', [0], {'a': 0}] %}"
                   "{{ 'T' if v else 'F' }}{% endfor %}{{ 'T' if missing else 'F' }}"),
            "FFFFFFFTTTTF");
}

TEST(JinjaOperatorTest, Precedence) {
  // Filters bind tighter than binary operators; unary minus binds tighter than filters.
  EXPECT_EQ(Render("{{ 'a' + ' b ' | trim + 'c' }}"), "abc");
  EXPECT_EQ(Render("{{ -2 | abs }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 * 3 ~ 4 }} "
                   "{{ not 1 == 2 }} {{ 2 ** 2 * 3 }} {{ -2 ** 2 }}"),
            "2 7 9 64 True 12 4");
}

TEST(JinjaTestTest, BuiltinTests) {
  EXPECT_EQ(Render("{{ 3 is odd }} {{ 4 is even }} {{ 10 is divisibleby 5 }} "
                   "{{ 10 is divisibleby(3) }} {{ x is defined }} {{ x is undefined }} "
                   "{{ x is not defined }} {{ none is none }}"),
            "True True True False False True True True");
  EXPECT_EQ(
      Render("{{ 1 is number }} {{ true is number }} {{ true is integer }} {{ 1 is integer }} "
             "{{ 1.0 is float }} {{ true is boolean }} {{ 1 is true }} {{ true is true }} "
             "{{ false is false }}"),
      "True True False True True True False True True");
  EXPECT_EQ(Render("{{ 'a' is string }} {{ {} is mapping }} {{ [] is sequence }} "
                   "{{ 'x' is iterable }} {{ 1 is iterable }} {{ range is callable }} "
                   "{{ 'a'.upper is callable }} {{ [] is mapping }}"),
            "True True True True False True True False");
  EXPECT_EQ(Render("{{ 'a' is equalto 'a' }} {{ 1 is eq 1 }} {{ 1 is ne 2 }} {{ 1 is gt 0 }} "
                   "{{ 1 is lt 0 }} {{ 2 is ge 2 }} {{ 2 is le 1 }} {{ 2 is in [1, 2] }} "
                   "{{ none is sameas none }} {{ 'abc' is lower }} {{ 'ABC' is upper }} "
                   "{{ 'aB' is lower }}"),
            "True True True True False True False True True True True False");
  EXPECT_EQ(Render("{{ 'trim' is filter }} {{ 'odd' is test }} {{ 'nope' is filter }}"),
            "True True False");
}

TEST(JinjaAccessTest, SubscriptsAndAttributes) {
  Json ctx = {{"d", {{"a", 1}, {"b", {{"c", "deep"}}}}}, {"xs", {10, 20, 30}}};
  EXPECT_EQ(Render("{{ xs[-1] }} {{ xs[0] }} [{{ xs[5] }}] {{ xs.1 }} {{ d.a }} {{ d['b']['c'] }} "
                   "{{ d.b.c }} [{{ d.missing }}] [{{ d.missing.x }}]",
                   ctx),
            "30 10 [] 20 1 deep deep [] []");
  EXPECT_EQ(Render("{{ 'héllo'[1] }} {{ 'héllo'[-1] }} [{{ 'abc'[10] }}] {{ 'héllo 🌍' | length }}"),
            "é o [] 7");
}

TEST(JinjaAccessTest, Slices) {
  EXPECT_EQ(Render("{{ 'héllo'[1:3] }} {{ 'héllo'[::-1] }} {{ [1, 2, 3, 4, 5][1:4:2] }} "
                   "{{ [1, 2, 3][::-1] }} {{ [1, 2, 3][-2:] }} {{ 'abc'[:] }} {{ (1, 2, 3)[1:] }} "
                   "{{ 'abcdef'[-3:-1] }} {{ [1, 2, 3][10:] }} {{ 'abcdef'[4:1:-1] }}"),
            "él olléh [2, 4] [3, 2, 1] [2, 3] abc (2, 3) de [] edc");
  EXPECT_EQ(Render("{{ messages[1:] | length }}", {{"messages", {1, 2, 3}}}), "2");
}

TEST(JinjaMethodTest, StringMethods) {
  EXPECT_EQ(Render("[{{ '  x  '.strip() }}] [{{ 'xxaxx'.strip('x') }}] [{{ 'xxa'.lstrip('x') }}] "
                   "[{{ 'axx'.rstrip('x') }}] [{{ '\\u3000x\\u00a0\\n'.strip() }}]"),
            "[x] [a] [a] [a] [x]");
  EXPECT_EQ(Render("{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} "
                   "{{ 'a b c'.split(maxsplit=1) }} {{ 'a,b,c'.rsplit(',', 1) }} "
                   "{{ '  a b '.split(none, 1) }} {{ ' a b '.rsplit(none, 1) }}"),
            "['a', 'b', 'c'] ['a', 'b', '', 'c'] ['a', 'b,c'] ['a', 'b c'] ['a,b', 'c'] "
            "['a', 'b '] [' a', 'b']");
  EXPECT_EQ(Render("{{ 'hello'.startswith('he') }} {{ 'hello'.startswith(('x', 'h')) }} "
                   "{{ 'hello'.endswith('lo') }} {{ 'hello'.startswith('l', 2) }} "
                   "{{ 'hello'.endswith(('a', 'b')) }}"),
            "True True True True False");
  EXPECT_EQ(
      Render("{{ 'héllo'.find('l') }} {{ 'abc'.find('z') }} {{ 'banana'.count('an') }} "
             "{{ 'abc'.index('c') }} {{ 'abcabc'.rfind('b') }} {{ 'aaa'.replace('a', 'b', 2) }}"),
      "2 -1 2 2 4 bba");
  EXPECT_EQ(Render("{{ 'hello wORLD'.title() }} {{ \"it's\".title() }} {{ 'hELLO'.capitalize() }} "
                   "{{ 'ÉCOLE'.lower() }} {{ ', '.join(['a', 'b']) }}"),
            "Hello World It'S Hello école a, b");
  EXPECT_EQ(Render("{{ 'a\\nb\\r\\nc'.splitlines() }} {{ 'k=v'.partition('=') }} "
                   "{{ '42'.isdigit() }} {{ 'ab'.isalpha() }} {{ ' '.isspace() }} "
                   "{{ 'x.py'.removesuffix('.py') }} {{ '7'.zfill(3) }} {{ 'ab'.center(6, '*') }}"),
            "['a', 'b', 'c'] ('k', '=', 'v') True True True x 007 **ab**");
}

TEST(JinjaMethodTest, StrFormat) {
  EXPECT_EQ(Render("{{ '{} and {name}'.format(1, name='x') }}"), "1 and x");
  EXPECT_EQ(Render("{{ '{:>5}|{:<3}|{:^5}|{:05.1f}|{:,}|{:x}|{!r}'.format('a', 'b', 'c', 3.14159, "
                   "1234567, 255, 'q') }}"),
            "    a|b  |  c  |003.1|1,234,567|ff|'q'");
}

TEST(JinjaMethodTest, DictMethods) {
  Json ctx = {{"d", {{"a", 1}, {"b", 2}}}};
  EXPECT_EQ(
      Render("{{ d.get('a') }} {{ d.get('z', 'def') }} {{ d.get('z') }} {{ d.keys() | list }} "
             "{{ d.values() | list }} {{ d.items() | list }}",
             ctx),
      "1 def None ['a', 'b'] [1, 2] [('a', 1), ('b', 2)]");
  EXPECT_EQ(Render("{% set e = {} %}{% set _ = e.update({'x': 1}, y=2) %}{{ e }} "
                   "{{ e.pop('x') }} {{ e }} {{ e.setdefault('z', 3) }} {{ e }}"),
            "{'x': 1, 'y': 2} 1 {'y': 2} 3 {'y': 2, 'z': 3}");
}

TEST(JinjaMethodTest, ListMethodsMutateInPlace) {
  EXPECT_EQ(Render("{% set xs = [1] %}{% set _ = xs.append(2) %}{{ xs }} {{ xs.pop() }} {{ xs }} "
                   "{{ [1, 2, 3].index(2) }} {{ [1, 2, 2].count(2) }}"),
            "[1, 2] 2 [1] 1 2");
  EXPECT_EQ(Render("{% set ys = [3, 1] %}{% set _ = ys.extend([5]) %}{% set _ = ys.insert(0, 9) %}"
                   "{{ ys }} {{ ys.pop(0) }} {{ ys }}"),
            "[9, 3, 1, 5] 9 [3, 1, 5]");
  // Python reference semantics: both names see the append.
  EXPECT_EQ(Render("{% set a = [] %}{% set b = a %}{% set _ = b.append(1) %}{{ a }}"), "[1]");
  EXPECT_EQ(Render("{% set ns = namespace(l=[]) %}{% for i in range(3) %}"
                   "{% set _ = ns.l.append(i * i) %}{% endfor %}{{ ns.l }}"),
            "[0, 1, 4]");
}

TEST(JinjaGlobalTest, RangeDictAndStrftime) {
  EXPECT_EQ(Render("{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }} "
                   "{{ range(0) | list }}"),
            "[0, 1, 2] [1, 3, 5] [5, 3, 1] []");
  EXPECT_EQ(Render("{{ dict(a=1, b='x') }} {{ dict([('k', 'v')]) }}"),
            "{'a': 1, 'b': 'x'} {'k': 'v'}");
  ChatTemplateOptions options;
  options.clock = [] { return absl::FromUnixSeconds(1722000896); };  // 2024-07-26 13:34:56 UTC
  options.time_zone = absl::UTCTimeZone();
  EXPECT_EQ(Render("{{ strftime_now('%d %B %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S') }}",
                   Json::object(), options),
            "26 July 2024|2024-07-26 13:34:56");
}

}  // namespace
}  // namespace tandem::chat
