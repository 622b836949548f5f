"""Text that stresses detokenization: multi-byte scripts, emoji ZWJ sequences, flags, code."""

MULTILINGUAL = {
    "english": "The quick brown fox jumps over the lazy dog. It's 3:45 p.m., isn't it?",
    "french": "Où est la bibliothèque ? Ça coûte 12,50 € — très cher, n'est-ce pas ?",
    "german": "Größere Straßen führen über die Brücke; Äpfel und Öl sind günstig.",
    "chinese": "我爱自然语言处理。今天天气很好，我们去公园散步吧！",
    "japanese": "東京は日本の首都です。ひらがなとカタカナ、そして漢字を使います。",
    "korean": "안녕하세요! 한국어 텍스트를 토큰화하는 것은 재미있습니다.",
    "arabic": "مرحبا بالعالم! هذه جملة عربية للاختبار.",
    "hindi": "नमस्ते दुनिया! यह हिंदी में एक परीक्षण वाक्य है।",
    "emoji": "Family 👨‍👩‍👧‍👦, flags 🇫🇷🇯🇵🇺🇸, thumbs 👍🏽, heart ❤️, rocket 🚀!",
    "code": "def f(x):\n    if x > 0:\n        return {'a': [1, 2]}\n\treturn None\n\n\n  # two  spaces  \n",
}
MULTILINGUAL["mixed"] = " ".join(MULTILINGUAL.values())

# English-only training text, so every other script must go through byte fallback
ENGLISH_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Tokenizers split text into pieces that a language model can read.",
    "A byte fallback turns any character the vocabulary lacks into its UTF-8 bytes.",
    "Streaming output must never show half of a character to the user.",
    "def main():\n    print('hello world')\n    return 0\n",
] * 4
