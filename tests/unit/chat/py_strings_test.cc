// Python's str and float formatting rules that templates observe.
#include "common/chat/py_strings.h"

#include "common/chat/jinja_format.h"
#include "gtest/gtest.h"

namespace tandem::chat {
namespace {

TEST(PyFormatTest, FloatReprMatchesPython) {
  EXPECT_EQ(FloatRepr(1.0), "1.0");
  EXPECT_EQ(FloatRepr(0.1), "0.1");
  EXPECT_EQ(FloatRepr(-2.5), "-2.5");
  EXPECT_EQ(FloatRepr(100.0), "100.0");
  EXPECT_EQ(FloatRepr(1e16), "1e+16");
  EXPECT_EQ(FloatRepr(9999999999999998.0), "9999999999999998.0");
  EXPECT_EQ(FloatRepr(1e-5), "1e-05");
  EXPECT_EQ(FloatRepr(0.0001), "0.0001");
  EXPECT_EQ(FloatRepr(1.5e300), "1.5e+300");
  EXPECT_EQ(FloatRepr(123456.789), "123456.789");
  EXPECT_EQ(FloatRepr(0.0), "0.0");
  EXPECT_EQ(FloatRepr(-0.0), "-0.0");
  EXPECT_EQ(FloatRepr(1.0 / 0.0), "inf");
  EXPECT_EQ(FloatRepr(5e-324), "5e-324");
}

TEST(PyFormatTest, IntToString) {
  EXPECT_EQ(IntToString(0), "0");
  EXPECT_EQ(IntToString(-42), "-42");
  Int big = static_cast<Int>(1) << 100;
  EXPECT_EQ(IntToString(big), "1267650600228229401496703205376");
  EXPECT_EQ(IntToString(-big), "-1267650600228229401496703205376");
}

TEST(PyFormatTest, StringRepr) {
  auto repr = [](const std::string& s) {
    std::string out;
    AppendStringRepr(s, &out);
    return out;
  };
  EXPECT_EQ(repr("a"), "'a'");
  EXPECT_EQ(repr("it's"), "\"it's\"");
  EXPECT_EQ(repr("'\""), "'\\'\"'");
  EXPECT_EQ(repr("\x7f\xc2\x85\xe2\x80\xa8"), "'\\x7f\\x85\\u2028'");
  EXPECT_EQ(repr("é😀"), "'é😀'");
}

TEST(PyStringsTest, CodePoints) {
  EXPECT_EQ(CodePointCount("héllo 🌍"), 7u);
  EXPECT_EQ(CodePointCount("\xff\xfe"), 2u);  // ill-formed bytes count one each
  size_t begin, end;
  PyCodePointRange("héllo", 1, -1, &begin, &end);
  EXPECT_EQ(std::string("héllo").substr(begin, end - begin), "éll");
}

TEST(PyStringsTest, StripSplitReplace) {
  EXPECT_EQ(PyStrip("\t x \xe3\x80\x80", std::nullopt, true, true), "x");
  EXPECT_EQ(PyStrip("abcba", std::string("ab"), true, true), "c");
  EXPECT_EQ(PyStrip("éxé", std::string("é"), true, false), "xé");
  EXPECT_EQ(PySplit("", std::nullopt, -1).size(), 0u);
  EXPECT_EQ(PySplit("", std::string(","), -1), std::vector<std::string>{""});
  EXPECT_EQ(PyRSplit("a.b.c", std::string("."), 1), (std::vector<std::string>{"a.b", "c"}));
  EXPECT_EQ(PyReplace("abc", "", "-", -1), "-a-b-c-");
  EXPECT_EQ(PyReplace("abc", "", "-", 2), "-a-bc");
  EXPECT_EQ(PyCount("aaaa", "aa"), 2u);
  EXPECT_EQ(PySplitLines("a\r\nb\n", true), (std::vector<std::string>{"a\r\n", "b\n"}));
}

TEST(PyStringsTest, Case) {
  EXPECT_EQ(PyUpper("héllo"), "HÉLLO");
  EXPECT_EQ(PyLower("ÀB"), "àb");
  EXPECT_EQ(PyTitle("hello wORLD 1st"), "Hello World 1St");
  EXPECT_EQ(PyCapitalize("éCOLE"), "École");
  EXPECT_EQ(JinjaTitle("hello-world (x) it's"), "Hello-World (X) It's");
}

}  // namespace
}  // namespace tandem::chat
